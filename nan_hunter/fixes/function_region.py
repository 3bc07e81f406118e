"""The widest fix short of changing the model: the whole function around the culprit in FP32.

When an FP32 region around the culprit statement, and the region grown to the statements
producing its inputs, do not verify (a Python float or an int among the operands, a module call
inside the region, a value that is only back in range several statements later), the function
that holds the culprit (usually a submodule's ``forward``) runs with autocast disabled::

    def forward(self, q, k, mask=None):
        with torch.autocast(device_type="cuda", enabled=False):
            q = q.float() if isinstance(q, torch.Tensor) and q.dtype == torch.float16 else q
            k = k.float() if isinstance(k, torch.Tensor) and k.dtype == torch.float16 else k
            mask = ...
            <the body as it was>

Its parameters are the only values it reads from outside that autocast made FP16: those that
are FP16 tensors at run time are upcast, anything else (a Python number, an int from
``.size()``, a bool mask, a tensor that is FP32 already) passes as it is, so no cast lands on a
value that is not an FP16 tensor. Its own parameters and buffers are FP32 under autocast, its
submodules called inside compute in FP32 on FP32 inputs, and its FP32 results enter the rest of
the model, where autocast casts them again. Under ``model.half()`` there is no autocast to
disable (the weights themselves are FP16): no edit is made then.

A ``with`` block, not an ``@torch.autocast(..., enabled=False)`` decorator: the parameters' casts
have to run inside the disabled region, which a decorator would leave to the function's first
lines, and a ``with`` block reads the same wherever the function is defined. (A scan that
predicts CUDA on a CPU maps a user's decorator built at import too:
``nan_hunter.precision.device_alias``.)
"""

from __future__ import annotations

import ast
import pathlib

from nan_hunter.fixes.autocast_region import (
    INDENT_UNIT,
    RegionPatch,
    insert_line,
    newline_of,
    string_interior_lines,
)
from nan_hunter.fixes.edits import edits_between, render_diff
from nan_hunter.fixes.source_file import (
    Source,
    SourcePositions,
    compiles,
    parse_source,
)
from nan_hunter.fixes.statements import has_torch_import, import_insert_index, is_autocast_off

__all__ = ["build_function_region_patch"]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NOT_TENSOR_ANNOTATIONS = frozenset({"int", "float", "bool", "str", "complex", "bytes"})


def build_function_region_patch(
    path: pathlib.Path,
    culprit_line: int,
    *,
    dtype: str = "float16",
    device_type: str = "cuda",
    relative_to: pathlib.Path,
) -> RegionPatch | None:
    """Edits running the innermost function holding ``culprit_line`` with autocast disabled
    and its ``dtype`` tensor arguments upcast, or ``None`` when that cannot be done safely (no
    enclosing function, a one-line function, one already autocast-disabled, a lambda)."""
    parsed = parse_source(path)
    if parsed is None:
        return None
    source, tree = parsed
    text = source.text
    found = innermost_function(tree, culprit_line)
    if found is None:
        return None
    function, is_method = found
    if any(_is_autocast_decorator(d) for d in function.decorator_list):
        return None
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(
        body[0].value.value, str
    ):  # after the docstring
        if len(body) == 1:
            return None
        first = body[1]
    else:
        first = body[0]
    if first.lineno == function.lineno:
        return None  # ``def f(x): return x``: no line of its own to put the casts on
    positions = SourcePositions(text)
    lines = list(positions.lines)
    interior = string_interior_lines(lines)
    if interior is None:
        return None
    newline = newline_of(lines)
    def_indent = _indent(positions.line(function.lineno))
    body_indent = _indent(positions.line(first.lineno))
    if not body_indent.startswith(def_indent) or body_indent == def_indent:
        return None
    unit = "\t" if "\t" in body_indent else INDENT_UNIT
    last = function.end_lineno or function.lineno
    for lineno in range(first.lineno, last + 1):
        if lineno not in interior and lines[lineno - 1].strip():
            lines[lineno - 1] = unit + lines[lineno - 1]
    inner = body_indent + unit
    header = (
        f'{body_indent}with torch.autocast(device_type="{device_type}", enabled=False):{newline}'
    )
    casts = tensor_casts(tensor_parameters(function, is_method), dtype, inner, newline)
    return finish_patch(
        path, source, tree, positions, lines, [(first.lineno - 1, header + casts)],
        import_before=function.lineno, newline=newline, relative_to=relative_to,
        first_line=min([function.lineno, *(d.lineno for d in function.decorator_list)]),
        last_line=function.end_lineno or function.lineno,
    )


def tensor_casts(names: list[str], dtype: str, indent: str, newline: str) -> str:
    """One line per name: the value upcast when it is a ``dtype`` tensor at run time, else as
    it is (a Python number, an int, a bool mask, an FP32 tensor)."""
    return "".join(
        f"{indent}{name} = {name}.float() if isinstance({name}, torch.Tensor) and "
        f"{name}.dtype == torch.{dtype} else {name}{newline}"
        for name in names
    )


def finish_patch(
    path: pathlib.Path,
    source: Source,
    tree: ast.Module,
    positions: SourcePositions,
    lines: list[str],
    insertions: list[tuple[int, str]],
    *,
    import_before: int,
    newline: str,
    relative_to: pathlib.Path,
    first_line: int,
    last_line: int,
) -> RegionPatch | None:
    """``lines`` (the file's, already edited in place) with ``insertions`` made and
    ``import torch`` added where the code before ``import_before`` has none, as a patch; None
    when the result does not compile."""
    if not has_torch_import(tree.body, import_before, False):
        insertions = [
            *insertions,
            (import_insert_index(tree.body, positions, import_before, False),
             f"import torch{newline}"),
        ]
    for index, new_text in sorted(insertions, key=lambda item: item[0], reverse=True):
        insert_line(lines, index, new_text, newline)
    new_text = "".join(lines)
    if not compiles(new_text, str(path)):
        return None
    edits = edits_between(path, source.text, new_text)
    bom = "\ufeff" if source.bom else ""
    return RegionPatch(
        diff=render_diff(edits, relative_to), new_source=bom + new_text, edits=edits,
        first_line=first_line, last_line=last_line,
    )


def innermost_function(
    tree: ast.Module, line: int
) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool] | None:
    """The innermost function whose body holds ``line``, and whether it is a method (its first
    parameter the instance); ``None`` when the line is in none, or inside an autocast-disabled
    ``with`` or a lambda within it."""
    best: tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool] | None = None

    def visit(node: ast.AST, in_class: bool) -> None:
        nonlocal best
        for child in ast.iter_child_nodes(node):
            start, end = getattr(child, "lineno", None), getattr(child, "end_lineno", None)
            if start is None or end is None or not start <= line <= end:
                continue
            if isinstance(child, _FUNCTIONS) and child.body[0].lineno <= line:
                best = (child, in_class and not _is_static(child))
            elif isinstance(child, ast.Lambda) or (
                isinstance(child, (ast.With, ast.AsyncWith)) and is_autocast_off(child)
            ):
                best = None
                return
            visit(child, isinstance(child, ast.ClassDef))

    visit(tree, False)
    return best


def tensor_parameters(
    function: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool
) -> list[str]:
    """Parameters that may hold a tensor: all but the instance, ``*args``/``**kwargs`` and
    those annotated as a plain Python type."""
    arguments = function.args
    names = [*arguments.posonlyargs, *arguments.args]
    if is_method and names:
        names = names[1:]
    return [
        a.arg for a in [*names, *arguments.kwonlyargs]
        if not (isinstance(a.annotation, ast.Name) and a.annotation.id in _NOT_TENSOR_ANNOTATIONS)
    ]


def _is_static(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)


def _is_autocast_decorator(node: ast.expr) -> bool:
    call = node if isinstance(node, ast.Call) else None
    func = call.func if call is not None else node
    return isinstance(func, ast.Attribute) and func.attr == "autocast"


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]
