"""Which names in a function hold Python numbers (a float attribute, a module constant, an int from
``.size()``, a number-defaulted parameter): a ``.float()`` on one of them would fail.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from nan_hunter.fixes.source_file import dotted_name, last_name

_NUMBER_CALLS = frozenset({"float", "int", "len", "round", "abs", "min", "max"})
"""Builtins that give a Python number: always (``_NUMBER_OF_ANYTHING``), or when their arguments
are numbers (``abs(x)`` of a tensor is a tensor). ``math.*`` calls give numbers too."""


_NUMBER_OF_ANYTHING = frozenset({"float", "int", "len"})


_COUNT_METHODS = frozenset({"size", "dim", "numel", "item", "nelement", "ndimension"})
"""Tensor methods that give a Python number (``x.size(0)``: an int)."""


def python_numbers(tree: ast.Module, line: int) -> set[str]:
    """Names (``bsz``) and attributes (``self.scale``) that hold a Python number where ``line``
    runs, as far as the source says: assigned a number, an arithmetic of numbers, ``x.size(0)``,
    ``x.shape[-1]`` or ``len(x)`` in the function holding ``line``, at module level, or (an
    attribute of ``self``) anywhere in the class holding it, and never assigned anything else
    there. Never given ``.float()``: the trace sees their values among an op's scalars, not
    its tensors."""
    scopes: list[ast.AST] = [tree]
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and (
            node.lineno <= line <= (node.end_lineno or node.lineno)
        ):
            scopes.append(node)
    kinds: dict[str, bool] = {}
    parameters: set[str] = set()
    for scope in scopes:
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg, default in _parameters_with_defaults(scope.args):
                if _is_number_parameter(arg, default):
                    kinds[arg.arg] = True
                else:
                    parameters.add(arg.arg)
    for scope in scopes:
        nodes = scope.body if isinstance(scope, ast.Module) else ast.walk(scope)
        # an attribute set in another method of the class (``self.eps = eps`` in __init__):
        # that method's number parameters count where it is set
        local = _number_parameters_by_line(scope) if isinstance(scope, ast.ClassDef) else {}
        for node in nodes:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            known = {**local.get(node.lineno, {}), **kinds}
            is_number = is_number_expr(value, known)
            for target in targets:
                name = dotted_name(target)
                if name is not None and (isinstance(scope, ast.Module) or name.startswith(
                    "self.") or not isinstance(scope, ast.ClassDef)
                ):
                    kinds[name] = kinds.get(name, True) and is_number
    return {name for name, number in kinds.items() if number and name not in parameters}


def _number_parameters_by_line(cls: ast.ClassDef) -> dict[int, dict[str, bool]]:
    """Per line of each method of ``cls``: that method's parameters the signature says are
    numbers (``def __init__(self, eps=1e-8)``, ``d: int``)."""
    out: dict[int, dict[str, bool]] = {}
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        numbers = {
            arg.arg: True
            for arg, default in _parameters_with_defaults(method.args)
            if _is_number_parameter(arg, default)
        }
        for line in range(method.lineno, (method.end_lineno or method.lineno) + 1):
            out[line] = numbers
    return out


def _parameters_with_defaults(
    arguments: ast.arguments,
) -> list[tuple[ast.arg, ast.expr | None]]:
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
    pairs = list(zip(positional, [*defaults, *arguments.defaults], strict=True))
    return pairs + list(zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True))


def _is_number_parameter(arg: ast.arg, default: ast.expr | None) -> bool:
    """``eps=1e-5``, ``scale: float``: a parameter the signature says is a number."""
    annotation = arg.annotation
    if isinstance(annotation, ast.Name) and annotation.id in ("int", "float"):
        return True
    return default is not None and annotation is None and is_number_expr(default, {})


def is_number_expr(expr: ast.expr, known: Mapping[str, bool]) -> bool:
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
    if isinstance(expr, ast.UnaryOp):
        return is_number_expr(expr.operand, known)
    if isinstance(expr, ast.BinOp):
        return is_number_expr(expr.left, known) and is_number_expr(expr.right, known)
    if isinstance(expr, ast.Subscript):  # x.shape[-1], x.size()[0]
        base = expr.value
        return (isinstance(base, ast.Attribute) and base.attr == "shape") or (
            isinstance(base, ast.Call) and last_name(base.func) == "size"
        )
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id == "math":
                return True
            if func.attr in _COUNT_METHODS:
                return func.attr != "size" or bool(expr.args)  # x.size() is a torch.Size
            return False
        if isinstance(func, ast.Name) and func.id in _NUMBER_CALLS:
            return func.id in _NUMBER_OF_ANYTHING or all(
                is_number_expr(a, known) for a in expr.args
            )
        return False
    name = dotted_name(expr)
    return name is not None and known.get(name, False)
