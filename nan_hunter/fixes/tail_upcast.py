"""The elementwise ops that rounded a culprit's input, in FP32, with no region (autocast mode).

    c = torch.sigmoid(self.score(x) * 1.0).clamp(max=1 - 1e-6)   # 0.999998 rounds to 1.0
    return torch.log1p(-c)                                       # log1p(-1) = -inf

The statement region around the culprit and the ops that rounded its input upcasts the
region's leaves, so ``self.score`` runs in FP32 too (``self.score(x.float())``): all of the
block's matmul FLOPs. Here the value is upcast where it leaves the last matmul/conv on the way
(``self.score(x).float() * 1.0``): under autocast an elementwise op runs in the dtype of its
inputs, so the ops after the cast run in FP32 while the Linear stays in FP16::

    c = torch.sigmoid(self.score(x).float() * 1.0).clamp(max=1 - 1e-6)

Under autocast a matmul on the way is cast at its result (``(q @ k.t()).float()``: autocast
casts its inputs down whatever they are). ``sites`` are the ops whose operands get
``.float()``: the first ops of the elementwise tail,
each with the operand positions to leave (FP32 already, or computed by another op of the
tail). Under ``model.half()`` (``cast_back``: the culprit's line and op) the culprit's result,
which fits the format, goes back to the dtype of the tensor the tail came from, since an FP32
value would meet the model's FP16 weights::

    c = torch.sigmoid(self.score(x).float() * 1.0).clamp(max=1 - 1e-6)
    return torch.log1p(-c).to(x.dtype)

``None`` whenever the edit cannot be made.
"""

from __future__ import annotations

import ast
import itertools
import pathlib
from collections.abc import Sequence

from nan_hunter.fixes.autocast_region import RegionPatch
from nan_hunter.fixes.edits import edits_between, render_diff
from nan_hunter.fixes.operands import (
    TextEdit,
    an_input,
    apply_text_edits,
    find_op_node,
    upcast_edits,
)
from nan_hunter.fixes.source_file import (
    SourcePositions,
    compiles,
    parse_source,
)
from nan_hunter.fixes.statements import SIMPLE_STATEMENTS, import_bindings, locate

UpcastSite = tuple[int, str, int, frozenset[int]]
"""``(line, op, n_tensor_operands, operands_left)`` of one op whose operands get ``.float()``."""


def build_tail_upcast_patch(
    path: pathlib.Path,
    sites: Sequence[UpcastSite],
    *,
    relative_to: pathlib.Path,
    cast_back: tuple[int, str] | None = None,
) -> RegionPatch | None:
    """``.float()`` on the low-precision operands of each op of ``sites`` (module calls and
    matmuls cast at their result, not their input), and with ``cast_back`` the result of the
    op there cast back to the dtype of a tensor the tail starts from; or None."""
    parsed = parse_source(path)
    if parsed is None:
        return None
    source, tree = parsed
    text = source.text
    positions = SourcePositions(text)
    edits: dict[tuple[int, int, str], TextEdit] = {}
    lines: list[int] = []
    for line, op, n_operands, left in sites:
        located = locate(tree.body, line)
        if located is None or not isinstance(located.stmt, SIMPLE_STATEMENTS):
            return None
        casts = upcast_edits(
            positions, tree, located.stmt, line, op, n_operands,
            uncast_operands=left, fallback=False, fp32_modules=False,
            matmul_results=cast_back is None,
        )
        if casts is None:
            return None
        for e in casts:
            edits[(e.start, e.end, e.replacement)] = e
        lines.append(line)
    if not edits:
        return None
    casts = list(edits.values())
    applied = casts
    if cast_back is not None:
        back = _cast_back(positions, tree, cast_back, casts, lines)
        if back is None:
            return None
        opening, closing = back
        # the closing ``).to(...)`` ends after a cast at the same offset, the opening ``(``
        # starts before one (``apply_text_edits``)
        applied = [closing, *casts, *([opening] if opening is not None else [])]
    ordered = sorted(applied, key=lambda e: (e.start, e.end))
    if any(a.end > b.start for a, b in itertools.pairwise(ordered) if a.start != b.start):
        return None  # overlapping casts: not one edit
    new_text = apply_text_edits(text, applied)
    if not compiles(new_text, str(path)):
        return None
    file_edits = edits_between(path, text, new_text)
    return RegionPatch(
        render_diff(file_edits, relative_to),
        ("\ufeff" if source.bom else "") + new_text,
        file_edits,
        min(lines),
        max(lines),
    )


def _cast_back(
    positions: SourcePositions,
    tree: ast.Module,
    where: tuple[int, str],
    casts: list[TextEdit],
    lines: list[int],
) -> tuple[TextEdit | None, TextEdit] | None:
    """``(`` (None after a call: ``f(...).to``) and ``).to(x.dtype)`` around the op at
    ``where``, ``x`` a tensor the casts start from (``operands.an_input``); None when there is
    none or the op cannot be found."""
    line, op = where
    located = locate(tree.body, line)
    if located is None or not isinstance(located.stmt, SIMPLE_STATEMENTS):
        return None
    node = find_op_node(located.stmt, line, op, import_bindings(tree)[1], False)
    if not isinstance(node, (ast.Call, ast.BinOp)):
        return None
    statements = []
    for at in dict.fromkeys(lines):
        found = locate(tree.body, at)
        if found is not None:
            statements.append(found.stmt)
    name = an_input(positions, statements, casts)
    if name is None:
        return None
    start, end = positions.span(node)
    if any(start < e.start < end and e.end > end for e in casts):
        return None
    if isinstance(node, ast.Call):  # ``weights.softmax(-1).to(q.dtype)``
        return None, TextEdit(end, end, f".to({name}.dtype)")
    return TextEdit(start, start, "("), TextEdit(end, end, f").to({name}.dtype)")
