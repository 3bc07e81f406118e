"""The range map as rows of plain cells, shared by the text, Markdown and HTML reports.

Each emitter escapes the cells for its own medium; the cells here hold the model's text (module
names, source lines) as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nan_hunter.core.range_map import Extent, ModuleRange, OpRange, RangeMap, module_label
from nan_hunter.findings import Report, scale_text
from nan_hunter.report.paths import display_path
from nan_hunter.trace.summary import format_number


def headroom_text(value: float | None) -> str:
    """``9.5x``; ``0x`` for an op that overflowed; ``–`` when nothing was measured."""
    if value is None:
        return "–"
    if math.isinf(value):
        return "inf"
    return f"{format_number(value) if value else '0'}x"


def share_text(share: float) -> str:
    """A share of values as a percentage: ``0%``, ``<0.1%``, ``12.5%``."""
    if share == 0:
        return "0%"
    if share < 0.001:
        return "<0.1%"
    return f"{format_number(share * 100)}%"


def abs_text(extent: Extent | None) -> str:
    if extent is None or extent.abs_max is None:
        return "–" if extent is None or not extent.nonfinite else "NaN/inf"
    carried = " +NaN/inf" if extent.nonfinite else ""
    return f"{format_number(extent.abs_max)}{carried}"


def where_text(op: OpRange) -> str:
    loc = op.location
    return f"{display_path(loc.file)}:{loc.line}" if loc is not None else "–"


def limits_text(m: RangeMap) -> str:
    """``float16: max 6.55e+04, smallest normal 6.10e-05; gradients at loss scale 2**16``."""
    return (
        f"{m.format}: max {format_number(m.limit)}, smallest normal "
        f"{format_number(m.smallest_normal)}; gradients at loss scale {scale_text(m.loss_scale)}"
    )


@dataclass(frozen=True)
class ClosestRow:
    """One line of the ``closest`` lists, as cells."""

    measure: str
    """``9.5x`` (headroom) or ``12%`` (share below the smallest normal)."""
    value: str
    """The largest |x|."""
    phase: str
    module: str
    op: str
    where: str


def closest_rows(m: RangeMap) -> tuple[list[ClosestRow], list[ClosestRow]]:
    """The ops nearest overflow, then the ops with most values below the smallest normal."""
    top = [
        ClosestRow(headroom_text(m.headroom(o.extent)), abs_text(o.extent), o.phase,
                   module_label(o.module), o.op, where_text(o))
        for o in m.top
    ]
    bottom = [
        ClosestRow(share_text(o.extent.tiny_share), abs_text(o.extent), o.phase,
                   module_label(o.module), o.op, where_text(o))
        for o in m.bottom
    ]
    return top, bottom


def module_cells(m: RangeMap, row: ModuleRange) -> list[str]:
    """module, ops, forward max |x|, headroom, below normal, backward max |g|, headroom."""
    back = row.backward
    return [
        module_label(row.module),
        str(row.ops),
        abs_text(row.forward),
        headroom_text(m.headroom(row.forward)),
        share_text(row.forward.tiny_share),
        abs_text(back),
        headroom_text(None if back is None else m.headroom(back)),
    ]


MODULE_HEADER = [
    "module", "ops", "fwd max |x|", "headroom", "< normal", "bwd max |g|", "headroom",
]


def culprit_modules(report: Report) -> set[str]:
    """Modules of the report's active errors (the rows a picture highlights); an error in the
    loss function is the ``(loss)`` row, found through its op in the closest lists."""
    errors = [f for f in report.active if f.is_error]
    found = {m for f in errors for m in (f.modules or (f.module,))}
    if report.range_map is not None:
        at = {(f.phase.value, f.op_index) for f in errors if f.op_index is not None}
        found |= {o.module for o in report.range_map.top if (o.phase, o.op_index) in at}
    return found


def margins(m: RangeMap) -> tuple[tuple[float, str] | None, tuple[float, str] | None]:
    """The least headroom of the forward and of the backward, each with its module."""
    def least(pairs: list[tuple[float, str]]) -> tuple[float, str] | None:
        return min(pairs, key=lambda p: p[0]) if pairs else None

    fwd = [(h, module_label(r.module)) for r in m.modules
           if (h := m.headroom(r.forward)) is not None]
    bwd = [(h, module_label(r.module)) for r in m.modules
           if r.backward is not None and (h := m.headroom(r.backward)) is not None]
    return least(fwd), least(bwd)


def margin_text(m: RangeMap) -> str:
    """``forward 2.54e+04x in fc1, backward 9.5x in head``."""
    fwd, bwd = margins(m)
    parts = [
        f"{phase} {headroom_text(pair[0])} in {pair[1]}"
        for phase, pair in (("forward", fwd), ("backward", bwd)) if pair is not None
    ]
    return ", ".join(parts) or "nothing measured"


@dataclass(frozen=True)
class ModuleGroup:
    """Rows of the map that differ only in block numbers (``layers.0.attn`` ..
    ``layers.11.attn``), shown as one: ``layers.0-11.attn``."""

    label: str
    members: tuple[ModuleRange, ...]
    forward: Extent
    backward: Extent | None


def group_modules(rows: tuple[ModuleRange, ...]) -> list[ModuleGroup]:
    """``rows`` with repeated blocks merged, in the order of each group's first row: the
    largest |x| and the counts of a group are those of all its members."""
    groups: dict[tuple[str | None, ...], list[ModuleRange]] = {}
    for row in rows:
        parts = row.module.split(".") if row.module else []
        key = tuple(None if p.isdigit() else p for p in parts) or ("",)
        if row.module.startswith("(") or not any(p is None for p in key):
            key = (row.module,)  # no block number: a row of its own (same name: merged)
        groups.setdefault(key, []).append(row)
    result = []
    for members in groups.values():
        forward = members[0].forward
        backward = members[0].backward
        for row in members[1:]:
            forward = forward.merged(row.forward)
            if row.backward is not None:
                backward = row.backward if backward is None else backward.merged(row.backward)
        result.append(ModuleGroup(_group_label(members), tuple(members), forward, backward))
    return result


def _group_label(members: list[ModuleRange]) -> str:
    if len(members) == 1:
        return module_label(members[0].module)
    split = [m.module.split(".") for m in members]
    label = []
    for i, part in enumerate(split[0]):
        if not part.isdigit():
            label.append(part)
            continue
        label.append(_numbers(sorted({int(s[i]) for s in split})))
    return ".".join(label)


def _numbers(values: list[int]) -> str:
    """``0-11`` for a run, ``0,2,5`` otherwise (at most 4 listed, then ``,...``)."""
    if len(values) > 1 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    shown_values = ",".join(str(v) for v in values[:4])
    return shown_values + (",..." if len(values) > 4 else "")
