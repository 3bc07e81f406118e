"""One-token rewrites a rule can ask for, made on the concrete source text.

Each function finds its target with ``ast`` on the culprit's line, replaces exactly that span
of the decoded text (comments, formatting, encoding and line endings elsewhere stay), checks
that the result compiles and returns the whole new text, or ``None`` when the rewrite cannot be
made safely.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from pathlib import Path

from nan_hunter.fixes.source_file import (
    SourceError,
    SourcePositions,
    compiles,
    dotted_name,
    last_name,
    read_source,
)

_SIGMOIDS = frozenset({"sigmoid"})


def _parse(path: Path) -> tuple[str, ast.Module, SourcePositions] | None:
    try:
        text = read_source(path).text
        tree = ast.parse(text)
    except (SourceError, SyntaxError, ValueError):
        return None
    return text, tree, SourcePositions(text)


def replace_spans(text: str, spans: list[tuple[int, int, str]]) -> str | None:
    """``text`` with each ``(start, end, new)`` span replaced; None when it no longer compiles."""
    for start, end, new in sorted(spans, reverse=True):
        text = text[:start] + new + text[end:]
    return text if compiles(text) else None


def _on_line(tree: ast.Module, line: int) -> Iterator[ast.AST]:
    for node in ast.walk(tree):
        start, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        if start is not None and end is not None and start <= line <= end:
            yield node


def _constant_value(node: ast.AST) -> float | None:
    """The value of ``-1e9``, ``1e-8``, ``float("-inf")``; None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _constant_value(node.operand)
        if inner is None:
            return None
        return -inner if isinstance(node.op, ast.USub) else inner
    if (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "float" and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    ):
        try:
            return float(node.args[0].value)
        except ValueError:
            return None
    return None


def _same(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)


def binds_torch(tree: ast.Module) -> bool:
    """Whether the module binds ``torch`` at its top level (``import torch``, not ``as th``)."""
    return any(
        isinstance(node, ast.Import) and any(a.name == "torch" and a.asname in (None, "torch")
                                             for a in node.names)
        for node in tree.body
    )


def finfo_limit(path: Path, line: int, value: float) -> str | None:
    """``masked_fill(mask, -1e9)`` -> ``masked_fill(mask, torch.finfo(scores.dtype).min)``:
    the constant on ``line`` equal to ``value`` becomes the limit of the tensor it meets (the
    receiver of a method call, the first argument of a function, the other operand)."""
    parsed = _parse(path)
    if parsed is None:
        return None
    text, tree, source = parsed
    if not binds_torch(tree):
        return None
    limit = "min" if value < 0 else "max"
    named = _named_constants(tree, line, value)

    def is_the_constant(expr: ast.expr) -> bool:
        """The number itself, or a name or ``self`` attribute only ever assigned it."""
        found = _constant_value(expr)
        if found is not None:
            return _same(found, value)
        return dotted_name(expr) in named

    for node in _on_line(tree, line):
        tensor: ast.expr | None = None
        constant: ast.expr | None = None
        if isinstance(node, ast.Call):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if is_the_constant(arg):
                    constant = arg
            if constant is not None and isinstance(node.func, ast.Attribute):
                is_torch = isinstance(node.func.value, ast.Name) and node.func.value.id in (
                    "torch", "F"
                )
                tensor = node.args[0] if is_torch and node.args else node.func.value
        elif isinstance(node, ast.BinOp):
            for this, other in ((node.left, node.right), (node.right, node.left)):
                if is_the_constant(this):
                    constant, tensor = this, other
        if constant is not None and tensor is not None:
            start, end = source.span(constant)
            receiver = source.segment(tensor)
            if not _cheap(tensor) and source.span(tensor)[1] <= start:
                # Computed once, bound where it is computed (before the constant is reached):
                # a repeated ``(q @ k.t()).dtype`` would run the matmul, or a dropout, twice.
                name = _unused_name(tree, "masked")
                t_start, t_end = source.span(tensor)
                if text[t_start - 1 : t_start] == "(" and text[t_end : t_end + 1] == ")":
                    t_start, t_end = t_start - 1, t_end + 1  # its own parentheses, not a call's
                bound = replace_spans(text, [
                    (t_start, t_end, f"({name} := {receiver})"),
                    (start, end, f"torch.finfo({name}.dtype).{limit}"),
                ])  # fmt: skip
                if bound is not None:  # else a place a walrus may not go: repeated below
                    return bound
            if not isinstance(tensor, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
                receiver = f"({receiver})"  # ``(q @ k.t() / d).dtype``, not ``... / d.dtype``
            new = f"torch.finfo({receiver}.dtype).{limit}"
            return replace_spans(text, [(start, end, new)])
    return None


def _cheap(expr: ast.expr) -> bool:
    """Whether evaluating ``expr`` again costs nothing and changes nothing: a name, an
    attribute of one, or an index of one by names and numbers (a view)."""
    if isinstance(expr, ast.Name):
        return True
    if isinstance(expr, ast.Attribute):
        return _cheap(expr.value)
    if isinstance(expr, ast.Subscript):
        index = ast.walk(expr.slice)
        allowed = (ast.Name, ast.Constant, ast.Slice, ast.Tuple, ast.UnaryOp, ast.USub,
                   ast.Load, ast.Attribute)  # fmt: skip
        return _cheap(expr.value) and all(isinstance(node, allowed) for node in index)
    return False


def _unused_name(tree: ast.Module, stem: str) -> str:
    """``stem``, or ``stem_2``, ``stem_3``... : the first that no name in the file uses."""
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
        node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)
    }
    name, n = stem, 1
    while name in used:
        n += 1
        name = f"{stem}_{n}"
    return name


def _named_constants(tree: ast.Module, line: int, value: float) -> set[str]:
    """Names and ``self`` attributes that every assignment in scope of ``line`` (its function,
    its class, the module's top level) sets to ``value``: ``self.neg = -1e9`` in ``__init__``
    makes ``self.neg`` in ``forward`` that constant."""
    scopes: list[ast.AST] = [
        node for node in ast.walk(tree)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    assigned: dict[str, bool] = {}
    nodes = [*tree.body, *(n for scope in scopes for n in ast.walk(scope))]
    for node in nodes:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        found = _constant_value(node.value)
        same = found is not None and _same(found, value)
        for target in targets:
            name = dotted_name(target)
            if name is not None:
                assigned[name] = assigned.get(name, True) and same
    return {name for name, same in assigned.items() if same}



def scalar_literal(path: Path, line: int, value: float, new_literal: str) -> str | None:
    """The number equal to ``value`` on ``line`` (an eps) written as ``new_literal``; when the
    line names it instead (an attribute, a parameter's default, a module constant), the one
    literal of the file equal to ``value``."""
    parsed = _parse(path)
    if parsed is None:
        return None
    text, tree, source = parsed
    signed = {id(n) for n in _numbers(tree)}
    for node in _on_line(tree, line):
        if id(node) in signed and _is_number(node, value):
            start, end = source.span(node)
            return replace_spans(text, [(start, end, new_literal)])
    # bound elsewhere: ``self.eps = 1e-8``, ``def __init__(self, eps=1e-8)``, ``EPS = 1e-8``;
    # only when the file writes that number once (another 1e-8 may be something else)
    found = [node for node in _numbers(tree) if _is_number(node, value)]
    if len(found) != 1:
        return None
    start, end = source.span(found[0])
    return replace_spans(text, [(start, end, new_literal)])


def _numbers(tree: ast.Module) -> list[ast.expr]:
    """The number literals of ``tree`` with their sign (``-1e9`` once, not its ``1e9``)."""
    negated = {
        id(node.operand) for node in ast.walk(tree)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    }
    return [
        node for node in ast.walk(tree)
        if isinstance(node, (ast.Constant, ast.UnaryOp)) and id(node) not in negated
    ]


def _is_number(node: ast.AST, value: float) -> bool:
    """A float literal equal to ``value``, ``-1e9`` included."""
    inner = node.operand if isinstance(node, ast.UnaryOp) else node
    if not (isinstance(inner, ast.Constant) and type(inner.value) is float):
        return False
    found = _constant_value(node)
    return found is not None and _same(found, value)


def bce_with_logits(path: Path, line: int) -> str | None:
    """``binary_cross_entropy(torch.sigmoid(z), y)`` -> ``binary_cross_entropy_with_logits(z,
    y)`` and ``nn.BCELoss()(torch.sigmoid(z), y)`` -> ``nn.BCEWithLogitsLoss()(z, y)``, when
    the sigmoid is written in the call itself (its only use is the loss)."""
    parsed = _parse(path)
    if parsed is None:
        return None
    text, tree, source = parsed
    for node in _on_line(tree, line):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        inner = node.args[0]
        if not (
            isinstance(inner, ast.Call)
            and last_name(inner.func) in _SIGMOIDS
            and (len(inner.args) == 1 or isinstance(inner.func, ast.Attribute))
        ):
            continue
        logits = inner.args[0] if inner.args else (
            inner.func.value if isinstance(inner.func, ast.Attribute) else None
        )
        if logits is None or inner.keywords:
            continue
        func = node.func
        spans: list[tuple[int, int, str]] = []
        if last_name(func) == "binary_cross_entropy":
            assert isinstance(func, (ast.Attribute, ast.Name))
            start, end = source.span(func)
            spans.append((start, end, source.segment(func) + "_with_logits"))
        elif isinstance(func, ast.Call) and last_name(func.func) == "BCELoss":
            start, end = source.span(func.func)
            name = source.segment(func.func)
            spans.append((start, end, name[: -len("BCELoss")] + "BCEWithLogitsLoss"))
        else:
            continue
        start, end = source.span(inner)
        spans.append((start, end, source.segment(logits)))
        return replace_spans(text, spans)
    return None


_AMP_DECORATORS = frozenset({"custom_fwd", "custom_bwd"})


def custom_function_fp32(path: Path, line: int, device_type: str) -> str | None:
    """The custom ``autograd.Function`` whose ``def backward`` is on ``line`` runs in FP32 under
    autocast: ``@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)`` on its
    ``forward`` (FP32 inputs, autocast off inside) and ``@torch.amp.custom_bwd(...)`` on its
    ``backward`` (the same autocast state as the forward), each written right above its
    ``def``. None for a Function already decorated so, one with ``setup_context`` (its
    ``forward`` takes no ``ctx`` for the decorator to record on), or a file without ``import
    torch``."""
    parsed = _parse(path)
    if parsed is None or not binds_torch(parsed[1]):
        return None
    text, tree, source = parsed
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {
            node.name: node for node in cls.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        backward, forward = methods.get("backward"), methods.get("forward")
        if backward is None or backward.lineno != line:
            continue
        if forward is None or "setup_context" in methods or any(
            last_name(d.func if isinstance(d, ast.Call) else d) in _AMP_DECORATORS
            for node in (forward, backward) for d in node.decorator_list
        ):
            return None
        device = f'device_type="{device_type}"'
        spans = [
            _line_above(source, forward.lineno,
                        f"@torch.amp.custom_fwd({device}, cast_inputs=torch.float32)"),
            _line_above(source, backward.lineno, f"@torch.amp.custom_bwd({device})"),
        ]
        return replace_spans(text, spans)
    return None


def _line_above(source: SourcePositions, lineno: int, code: str) -> tuple[int, int, str]:
    """An insertion of ``code`` as a line of its own above ``lineno``, indented as that line
    and ended as it is."""
    current = source.lines[lineno - 1]
    body = current.rstrip("\r\n")
    indent = body[: len(body) - len(body.lstrip())]
    start = source.offset(lineno, 0)
    return start, start, f"{indent}{code}{current[len(body):] or chr(10)}"
