"""Under ``model.half()``: the module holding the culprit kept in FP32, with casts in and out.

With the whole model cast to FP16 there is no autocast to disable, and a statement region
cannot help when what fails is the module's own FP16 state: a buffer that ``.half()`` flushed
(``register_buffer("eps", torch.tensor(1e-9))`` is 0), or a submodule whose FP16 weights meet
the region's FP32 result. transformers keeps such modules in FP32 (``_keep_in_fp32_modules``);
in a model file the module does it itself, for whoever casts the model::

    class RMSNorm(nn.Module):
        def _apply(self, fn, *args, **kwargs):
            # kept in float32 when the model is cast to float16 (nan-hunter): float16
            # cannot hold what it computes
            def keep_float32(t):
                cast = fn(t)
                if t.dtype == torch.float32 and cast.dtype == torch.float16:
                    return t.to(cast.device)
                return cast
            return super()._apply(keep_float32, *args, **kwargs)

        def forward(self, x):
            entry_dtype = x.dtype if isinstance(x, torch.Tensor) else torch.float32
            x = x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.float16 else x
            ...
            result = <what it returned>
            if isinstance(result, torch.Tensor) and result.is_floating_point():
                result = result.to(entry_dtype)
            return result

(a ``return a, b`` casts each of its floating tensors back).

``model.half()`` (``.to(torch.float16)``, ``.bfloat16()`` for ``dtype="bfloat16"``) goes
through every module's ``_apply``: this module's FP32 parameters and buffers keep their FP32
values (moved to the new device, if the call moves one), its submodules with them. Its FP16
tensor arguments are upcast on entry, and what it returns is cast back to the dtype its first
floating argument came in with (FP16 under ``.half()``, FP32 in an FP32 model, so the model's
FP32 reference is unchanged). Whether the cast back lands inside FP16's range is what the
re-scan decides.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

from nan_hunter.fixes.autocast_region import (
    INDENT_UNIT,
    RegionPatch,
    newline_of,
    string_interior_lines,
)
from nan_hunter.fixes.function_region import (
    finish_patch,
    innermost_function,
    tensor_casts,
    tensor_parameters,
)
from nan_hunter.fixes.source_file import SourcePositions, parse_source

__all__ = ["KeptModulePatch", "build_kept_module_patch"]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclass(frozen=True)
class KeptModulePatch:
    """The edits keeping a module class in FP32, and the class they change."""

    region: RegionPatch
    class_name: str


def build_kept_module_patch(
    path: pathlib.Path,
    culprit_line: int,
    *,
    dtype: str = "float16",
    relative_to: pathlib.Path,
) -> KeptModulePatch | None:
    """Edits keeping the class of the method holding ``culprit_line`` in FP32 under a cast of
    the model to ``dtype`` (the method gets the casts; a line in ``__init__`` gives them to
    ``forward``), or ``None`` when that cannot be done safely: the line is in no
    method, the class has an ``_apply`` of its own, the method takes no tensor argument to
    take the dtype to cast back to from, or a ``return`` shares its line with other code."""
    parsed = parse_source(path)
    if parsed is None:
        return None
    source, tree = parsed
    text = source.text
    found = innermost_function(tree, culprit_line)
    if found is None or not found[1]:
        return None
    function = found[0]
    owner = _owning_class(tree, function)
    if owner is not None and function.name == "__init__":
        # a parameter or buffer set up in __init__ (NH005's line): the class's forward computes
        # with it
        function = next(
            (n for n in owner.body if isinstance(n, _FUNCTIONS) and n.name == "forward"), None
        )
        if function is None:
            return None
    if owner is None or any(
        isinstance(node, _FUNCTIONS) and node.name == "_apply" for node in owner.body
    ):
        return None
    arguments = tensor_parameters(function, True)
    if not arguments:
        return None
    positions = SourcePositions(text)
    lines = list(positions.lines)
    if string_interior_lines(lines) is None:
        return None
    body = function.body
    first = body[1] if _is_docstring(body[0]) and len(body) > 1 else body[0]
    if first is body[0] and _is_docstring(first):
        return None
    if first.lineno == function.lineno:
        return None
    newline = newline_of(lines)
    body_indent = _indent(positions.line(first.lineno))
    def_indent = _indent(positions.line(function.lineno))
    if not body_indent.startswith(def_indent) or body_indent == def_indent:
        return None
    unit = "\t" if "\t" in body_indent else INDENT_UNIT
    taken = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)} | {
        a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)
    }
    entry, result = _free("entry_dtype", taken), _free("result", taken)
    insertions: list[tuple[int, str]] = []
    for ret in _returns(function):
        if ret.value is None:
            continue
        row = lines[ret.lineno - 1]
        col = positions.char_col(ret.lineno, ret.col_offset)
        if _indent(row) != row[:col]:
            return None  # ``if c: return x``: no line of its own to rewrite
        end = ret.end_lineno or ret.lineno
        indent = _indent(row)
        lines[ret.lineno - 1] = f"{row[:col]}{result} ={row[col + len('return'):]}"
        if not lines[end - 1].endswith(("\n", "\r")):
            lines[end - 1] += newline
        if isinstance(ret.value, ast.Tuple):  # ``return out, weights``: each one cast back
            cast_back = (
                f"{indent}{result} = tuple({newline}"
                f"{indent}{unit}r.to({entry}) if isinstance(r, torch.Tensor) and "
                f"r.is_floating_point() else r{newline}"
                f"{indent}{unit}for r in {result}{newline}"
                f"{indent}){newline}"
            )
        else:
            cast_back = (
                f"{indent}if isinstance({result}, torch.Tensor) and {result}.is_floating_point():"
                f"{newline}{indent}{unit}{result} = {result}.to({entry}){newline}"
            )
        insertions.append((end, f"{cast_back}{indent}return {result}{newline}"))
    if not insertions:
        return None
    inner = body_indent
    if len(arguments) == 1:
        (name,) = arguments
        record = (
            f"{inner}{entry} = {name}.dtype if isinstance({name}, torch.Tensor) and "
            f"{name}.is_floating_point() else torch.float32{newline}"
        )
    else:
        record = (
            f"{inner}{entry} = next({newline}"
            f"{inner}{unit}(t.dtype for t in ({', '.join(arguments)}) "
            f"if isinstance(t, torch.Tensor) and t.is_floating_point()),{newline}"
            f"{inner}{unit}torch.float32,{newline}"
            f"{inner}){newline}"
        )
    casts = tensor_casts(arguments, dtype, inner, newline)
    insertions.append((first.lineno - 1, record + casts))
    starts = [function.lineno, *(d.lineno for d in function.decorator_list)]
    method_indent = def_indent
    keep = "".join(
        f"{method_indent}{row}{newline}" if row else newline
        for row in _keep_method(dtype, unit)
    )
    insertions.append((min(starts) - 1, keep + newline))
    region = finish_patch(
        path, source, tree, positions, lines, insertions,
        import_before=owner.lineno, newline=newline, relative_to=relative_to,
        first_line=min(starts), last_line=function.end_lineno or function.lineno,
    )
    if region is None:
        return None
    return KeptModulePatch(region, owner.name)


def _keep_method(dtype: str, unit: str) -> list[str]:
    return [
        "def _apply(self, fn, *args, **kwargs):",
        f"{unit}# kept in float32 when the model is cast to {dtype} (nan-hunter): {dtype}",
        f"{unit}# cannot hold what it computes",
        f"{unit}def keep_float32(t):",
        f"{unit * 2}cast = fn(t)",
        f"{unit * 2}if t.dtype == torch.float32 and cast.dtype == torch.{dtype}:",
        f"{unit * 3}return t.to(cast.device)",
        f"{unit * 2}return cast",
        f"{unit}return super()._apply(keep_float32, *args, **kwargs)",
    ]


def _owning_class(tree: ast.Module, function: ast.AST) -> ast.ClassDef | None:
    """The class whose body holds ``function`` directly."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and function in node.body:
            return node
    return None


def _returns(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Return]:
    """The function's own ``return`` statements (not those of functions defined inside it)."""
    found: list[ast.Return] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Return):
                found.append(child)
            elif not isinstance(child, _SCOPES):
                visit(child)

    for stmt in function.body:
        if isinstance(stmt, ast.Return):
            found.append(stmt)
        elif not isinstance(stmt, _SCOPES):
            visit(stmt)
    return found


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _free(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    return name


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]
