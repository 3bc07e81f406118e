"""Under ``model.half()``: a sum FP16 cannot hold, computed in FP32 and clamped to the format's
finite range before it goes back to FP16 (transformers' T5 pattern)::

    h = h + self.ff(h)

becomes::

    h = h.float() + self.ff(h).float()
    if h_in_dtype == torch.float16:
        clamp_value = torch.finfo(h_in_dtype).max - 1000
        h = torch.clamp(h, min=-clamp_value, max=clamp_value)
    h = h.to(h_in_dtype)

Computing the sum in FP32 and casting it back alone re-creates the inf at the cast when nothing
before the next FP16 module brings it back into range (a LayerNorm with FP16 weights). The clamp
acts only when the values came in as FP16: in an FP32 run the statement computes what it did
(``.float()`` and ``.to(float32)`` change nothing), so the fix is unsafe only in what it does to
FP16 values beyond the range, which verification measures. Offered for a plain assignment to a
name, alone on its lines, whose value is the culprit op; ``None`` otherwise.
"""

from __future__ import annotations

import ast
import pathlib

from nan_hunter.fixes.autocast_region import RegionPatch, newline_of
from nan_hunter.fixes.edits import edits_between, render_diff
from nan_hunter.fixes.operands import find_op_node, upcast_edits
from nan_hunter.fixes.source_file import SourceError, SourcePositions, compiles, decode_source
from nan_hunter.fixes.statements import (
    ends_line,
    import_bindings,
    leading_indent,
    locate,
    starts_line,
)

MARGIN = 1000
"""What the clamp leaves below the format's maximum (transformers' T5: ``finfo.max - 1000``),
so that a small addition after it stays finite."""


def build_clamp_patch(
    path: pathlib.Path,
    culprit_line: int,
    op_name: str,
    n_tensor_operands: int,
    *,
    relative_to: pathlib.Path,
    uncast_operands: frozenset[int] = frozenset(),
) -> RegionPatch | None:
    """The edit computing the culprit's statement in FP32, clamped and cast back, or None."""
    try:
        source = decode_source(path, path.read_bytes())
    except (SourceError, OSError):
        return None
    text = source.text
    planned = _plan(text, culprit_line, op_name, n_tensor_operands, uncast_operands)
    if planned is None:
        return None
    new_text, line = planned
    if not compiles(new_text, str(path)):
        return None
    edits = edits_between(path, text, new_text)
    return RegionPatch(render_diff(edits, relative_to), ("\ufeff" if source.bom else "")
                       + new_text, edits, line, line)


def _plan(
    text: str, line: int, op_name: str, n_operands: int, uncast: frozenset[int]
) -> tuple[str, int] | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    source = SourcePositions(text)
    located = locate(tree.body, line)
    if located is None or located.in_fp32_region or not located.in_function:
        return None
    stmt = located.stmt
    if not (
        isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and starts_line(source, stmt) and ends_line(source, stmt)
    ):
        return None
    node = find_op_node(stmt, line, op_name, import_bindings(tree)[1], False)
    if node is None or node is not stmt.value or not isinstance(node, (ast.BinOp, ast.Call)):
        return None
    operand = _dtype_operand(node)
    casts = upcast_edits(source, tree, stmt, line, op_name, n_operands, uncast_operands=uncast,
                         fallback=False)
    if operand is None or not casts:
        return None
    start, end = source.span(stmt.value)
    value = text[start:end]
    for edit in sorted(casts, key=lambda e: (e.start, e.end), reverse=True):
        if not (start <= edit.start and edit.end <= end):
            return None
        value = (value[: edit.start - start] + edit.replacement + value[edit.end - start :])
    target = stmt.targets[0].id
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    dtype, limit = _fresh(f"{target}_in_dtype", taken), _fresh("clamp_value", taken)
    indent = leading_indent(source, stmt)
    unit = "\t" if "\t" in indent else "    "
    newline = newline_of(source.lines)
    first, last = stmt.lineno, stmt.end_lineno
    assert last is not None
    line_end = text.find("\n", end)
    rest = text[end : len(text) if line_end < 0 else line_end].strip()
    comment = f"  {rest}" if rest.startswith("#") else ""  # kept on the sum's line
    block = (
        f"{indent}{dtype} = {operand}.dtype{newline}"
        f"{indent}{target} = {value}{comment}{newline}"
        f"{indent}if {dtype} == torch.float16:{newline}"
        f"{indent}{unit}{limit} = torch.finfo({dtype}).max - {MARGIN}{newline}"
        f"{indent}{unit}{target} = torch.clamp({target}, min=-{limit}, max={limit}){newline}"
        f"{indent}{target} = {target}.to({dtype}){newline}"
    )
    lines = source.lines
    out = [*lines[: first - 1], block, *lines[last:]]
    return "".join(out), first


def _dtype_operand(node: ast.BinOp | ast.Call) -> str | None:
    """The first operand that is a plain name: its dtype is the one the sum goes back to."""
    operands = [node.left, node.right] if isinstance(node, ast.BinOp) else list(node.args)
    return next((o.id for o in operands if isinstance(o, ast.Name)), None)


def _fresh(name: str, taken: set[str]) -> str:
    found, i = name, 2
    while found in taken:
        found, i = f"{name}_{i}", i + 1
    return found
