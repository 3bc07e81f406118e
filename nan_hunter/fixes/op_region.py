"""The culprit op alone in FP32, when its statement computes more than it (autocast mode).

    y = self.big_linear(x) + torch.einsum("bij,bjk->bik", a, b)

becomes::

    with torch.autocast(device_type="cuda", enabled=False):
        einsum_fp32 = torch.einsum("bij,bjk->bik", a.float(), b.float())
    y = self.big_linear(x) + einsum_fp32

The op's call is taken out of its statement into an autocast-disabled region of its own, its
low-precision operands upcast; the rest of the statement (the large Linear) stays under
autocast. Offered only where the statement does other work beside the op that does not take
its result (the Linear); ``(x * x).mean()`` gets the statement region alone. The result is
cast back to the dtype of one of the op's operands (``.to(a.dtype)``) only where it fits the
format (its FP32 reference values are in range); an out-of-range result goes on in FP32 to its
consumers. The call is evaluated before the rest of its statement: never taken out of a
lambda, a comprehension, a conditional expression or a short-circuit (where it may not run at
all, or runs per item), nor out of a statement that shares its lines. ``None`` whenever the
edit cannot be made.

Under ``model.half()`` (``half=True``) there is no autocast to disable: the call is taken out
into an assignment of its own with its FP16 operands upcast, and its value must go back to the
dtype it came in (an FP32 value would meet the model's FP16 weights). Where the op's own result
does not fit the format, the ops of the statement that take it up to the one that brings it
back into range (``consumers``: ``* 1e-3``) go with it::

    einsum_fp32 = (torch.einsum("bij,bjk->bik", a.float(), b.float()) * 1e-3).to(a.dtype)
    y = self.big_linear(x) + einsum_fp32
"""

from __future__ import annotations

import ast
import pathlib

from nan_hunter.fixes.autocast_region import INDENT_UNIT, RegionPatch, newline_of
from nan_hunter.fixes.edits import edits_between, render_diff
from nan_hunter.fixes.operands import (
    TextEdit,
    apply_text_edits,
    binary_operator,
    find_op_node,
    upcast_edits,
)
from nan_hunter.fixes.source_file import (
    SourceError,
    SourcePositions,
    compiles,
    decode_source,
    last_name,
)
from nan_hunter.fixes.statements import (
    SIMPLE_STATEMENTS,
    ends_line,
    has_torch_import,
    import_bindings,
    import_insert_index,
    leading_indent,
    locate,
    starts_line,
)

_DEFERRED = (
    ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.IfExp, ast.BoolOp,
)


def build_op_region_patch(
    path: pathlib.Path,
    culprit_line: int,
    op_name: str,
    n_tensor_operands: int,
    *,
    device_type: str,
    relative_to: pathlib.Path,
    uncast_operands: frozenset[int] = frozenset(),
    cast_back: bool = False,
    half: bool = False,
    consumers: tuple[str, ...] = (),
) -> RegionPatch | None:
    """The edit taking the op call out of its statement into its own FP32 region (``half``:
    an assignment of its own, cast back), or None. ``consumers``: the ops (trace names, in
    order) of the statement that take the op's result along with it."""
    try:
        source = decode_source(path, path.read_bytes())
    except (SourceError, OSError):
        return None
    text = source.text
    planned = _plan(text, culprit_line, op_name, n_tensor_operands, device_type,
                    uncast_operands, cast_back or half, half, consumers)
    if planned is None:
        return None
    new_text, first, last = planned
    if not compiles(new_text, str(path)):
        return None
    edits = edits_between(path, text, new_text)
    return RegionPatch(render_diff(edits, relative_to), ("\ufeff" if source.bom else "")
                       + new_text, edits, first, last)


def _plan(
    text: str,
    line: int,
    op_name: str,
    n_operands: int,
    device_type: str,
    uncast: frozenset[int],
    cast_back: bool,
    half: bool = False,
    consumers: tuple[str, ...] = (),
) -> tuple[str, int, int] | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    source = SourcePositions(text)
    located = locate(tree.body, line)
    if located is None or located.in_fp32_region:
        return None
    stmt = located.stmt
    if not isinstance(stmt, SIMPLE_STATEMENTS) or isinstance(stmt, ast.AugAssign):
        return None
    if not (starts_line(source, stmt) and ends_line(source, stmt)):
        return None
    node = find_op_node(stmt, line, op_name, import_bindings(tree)[1], True)
    if not isinstance(node, (ast.Call, ast.BinOp)):
        return None
    op_node = node
    if consumers:
        taken = _with_consumers(stmt, node, consumers)
        if taken is None:
            return None
        node = taken
    if node is getattr(stmt, "value", None):
        return None
    if _deferred(stmt, node) or not _other_work(stmt, node):
        return None
    casts = upcast_edits(source, tree, stmt, line, op_name, n_operands, uncast_operands=uncast)
    if casts is None:
        return None
    start, end = source.span(node)
    if any(not (start <= e.start and e.end <= end) for e in casts):
        return None
    call = apply_text_edits(
        text[start:end], [TextEdit(e.start - start, e.end - start, e.replacement) for e in casts]
    )
    name = _fresh_name(tree, op_name)
    if cast_back:
        operand = _named_operand(op_node, source)
        if operand is not None:
            call = f"({call}).to({operand}.dtype)"
        elif half:
            return None  # an FP32 value would meet the model's FP16 weights
    if "\n" in call:
        call = f"({call})"
    first_line, last_line = stmt.lineno, stmt.end_lineno
    assert last_line is not None
    lines = source.lines
    newline = newline_of(lines)
    indent = leading_indent(source, stmt)
    unit = "\t" if "\t" in indent else INDENT_UNIT
    region = (
        f"{indent}{name} = {call}{newline}" if half else
        f'{indent}with torch.autocast(device_type="{device_type}", enabled=False):{newline}'
        f"{indent}{unit}{name} = {call}{newline}"
    )
    if text[start - 1 : start] == "(" and text[end : end + 1] == ")" and not (
        text[: start - 1].rstrip()[-1:].isidentifier() or text[: start - 1].rstrip()[-1:] in ")]"
    ):
        start, end = start - 1, end + 1  # ``(x * x).mean()``: the parentheses go with it
    body = text[: start] + name + text[end:]
    out = body.splitlines(keepends=True)
    out.insert(first_line - 1, region)
    if not half and not has_torch_import(tree.body, first_line, located.in_function):
        at = import_insert_index(tree.body, source, first_line, located.in_function)
        out.insert(at, f"import torch{newline}")
    return "".join(out), first_line, last_line


def _other_work(stmt: ast.stmt, node: ast.AST) -> bool:
    """The statement computes something beside the op that does not take the op's result (a
    Linear added to it): what the statement's region would move to FP32 for nothing. The ops
    taking its result (a ``.mean()`` of it) get its FP32 result from either candidate."""
    inside = set(map(id, ast.walk(node)))
    around = {id(outer) for outer in ast.walk(stmt) if id(node) in set(map(id, ast.walk(outer)))}
    return any(
        isinstance(n, (ast.Call, ast.BinOp)) and id(n) not in inside and id(n) not in around
        for n in ast.walk(stmt)
    )


def _deferred(stmt: ast.stmt, node: ast.AST) -> bool:
    """``node`` sits inside an expression that may not evaluate it, or not once."""
    for outer in ast.walk(stmt):
        if isinstance(outer, _DEFERRED) and outer is not node and any(
            inner is node for inner in ast.walk(outer)
        ):
            return True
    return False


def _fresh_name(tree: ast.Module, op_name: str) -> str:
    """``einsum_fp32``, ``matmul_fp32``: a name the file does not use yet."""
    base = op_name.rsplit(".", 1)[-1].strip("_") or "op"
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    taken |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    name, i = f"{base}_fp32", 2
    while name in taken:
        name, i = f"{base}_fp32_{i}", i + 1
    return name


def _named_operand(node: ast.Call | ast.BinOp, source: SourcePositions) -> str | None:
    """The first operand that is a plain name or an attribute of one (``u``, ``self.w``): its
    dtype is the one the result goes back to."""
    operands = [node.left, node.right] if isinstance(node, ast.BinOp) else list(node.args)
    return next((source.segment(o) for o in operands if _is_named(o)), None)


def _is_named(expr: ast.expr) -> bool:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name)


def _applies(
    outer: ast.AST | None,
    node: ast.AST,
    method: str,
    operator: tuple[type[ast.operator], str] | None,
) -> bool:
    """``outer`` applies the op to ``node``: ``node * 1e-3``, ``torch.mul(node, 1e-3)``."""
    if operator is not None:
        return isinstance(outer, ast.BinOp) and isinstance(outer.op, operator[0])
    return isinstance(outer, ast.Call) and node in outer.args and (
        last_name(outer.func) == method
    )


def _with_consumers(stmt: ast.stmt, node: ast.AST, consumers: tuple[str, ...]) -> ast.AST | None:
    """``node`` grown to the expressions around it that apply ``consumers`` in turn (``(op) *
    1e-3``, ``op.mul(1e-3)``); None when the statement does not apply them to it."""
    parents = {
        id(child): outer for outer in ast.walk(stmt) for child in ast.iter_child_nodes(outer)
    }
    for op_name in consumers:
        outer = parents.get(id(node))
        method = op_name.rsplit(".", 1)[-1]
        operator = binary_operator(op_name)
        if isinstance(outer, ast.Attribute) and outer.value is node:
            call = parents.get(id(outer))
            if not (isinstance(call, ast.Call) and call.func is outer and outer.attr == method):
                return None
            node = call
        elif _applies(outer, node, method, operator):
            assert outer is not None
            node = outer
        else:
            return None
    return node
