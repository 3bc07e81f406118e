"""What the NH6xx rules share: the precision check's sites sorted into integers past the exact
range (NH601), cancellation (NH602), long accumulation (NH603) and other loss (NH609), and their
findings."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from nan_hunter.engine.candidate import ScanEvidence
from nan_hunter.engine.precision_loss import SUBTRACTIONS, OpPrecision, PrecisionEvidence, op_name
from nan_hunter.findings import Finding, Phase
from nan_hunter.rules.registry import SiteRule, advice_finding
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import format_number

ACCUMULATIONS = frozenset({"sum", "nansum", "cumsum", "cumprod", "prod"})
"""Ops whose result grows with the number of values they take in (a mean does not: PyTorch's
kernels accumulate in FP32 and its result keeps its inputs' magnitude)."""


def percent(value: float) -> str:
    return "inf" if math.isinf(value) else f"{format_number(value * 100)}%"


def where(event: OpEvent) -> str:
    loc = event.location
    return f"{event.op} at {Path(loc.file).name}:{loc.line}" if loc else event.op


def integer_roots(p: PrecisionEvidence) -> list[OpPrecision]:
    """NH601's sites: the ops that put integers past the exact range into low precision, not
    counting those that only pass on such values from another site (a view, a slice)."""
    sites = p.integer_sites()
    indices = {op.event.index for op in sites}
    return [op for op in sites if not any(q in indices for q in op.event.producers)]


def accumulation_length(event: OpEvent) -> int:
    """How many values one result of a sum/cumsum/prod takes in: the reduced length."""
    if not event.inputs or not event.outputs:
        return 0
    size_in, size_out = event.inputs[0].numel, event.outputs[0].numel
    name = op_name(event)
    if name.startswith("cum"):
        shape = event.inputs[0].shape
        if not shape:
            return 1
        dim = event.ints[0] if event.ints else 0
        return shape[dim] if -len(shape) <= dim < len(shape) else 0
    return size_in // size_out if size_out else 0


def long_accumulations(scan: ScanEvidence) -> list[OpEvent]:
    """NH603's sites: sums, cumsums and products over ``accumulation_length`` values or more
    whose result is in the low-precision format (autocast's FP32 list, or ``dtype=`` on the call,
    would have made it FP32)."""
    assert scan.low is not None
    limit = scan.settings.accumulation_length
    return [
        e for e in scan.low.events
        if op_name(e) in ACCUMULATIONS and e.inputs_finite and e.outputs_finite
        and any(s.dtype == scan.fmt.name for s in e.outputs)
        and accumulation_length(e) >= limit
    ]  # fmt: skip


def jumps(scan: ScanEvidence) -> tuple[list[OpPrecision], list[OpPrecision]]:
    """(NH602, NH609): the ops whose error jumps, subtractions first, without NH601's and
    NH603's sites and the ops downstream of them."""
    p = scan.precision
    if p is None or scan.low is None:
        return [], []
    # what an integer site or a long accumulation upstream ruins is theirs (the difference
    # of two cumsum values cancels because the cumsum was rounded)
    roots = {op.event.index for op in integer_roots(p)}
    roots |= {e.index for e in long_accumulations(scan)}
    depth = scan.settings.upstream_depth
    events = scan.low.events
    found = [
        op for op in p.origins
        if op.event.index not in roots
        and p.downstream_of(events, op.event.index, roots, depth) is None
    ]
    # and what an origin ruins is its own (a division by a cancelled variance jumps again)
    first = {op.event.index for op in found}
    found = [op for op in found if p.downstream_of(events, op.event.index, first, depth) is None]
    cancel = [op for op in found if op_name(op.event) in SUBTRACTIONS]
    return cancel, [op for op in found if op_name(op.event) not in SUBTRACTIONS]


def first_jump_after(scan: ScanEvidence, site: OpPrecision) -> OpPrecision | None:
    """The first op downstream of an NH601 site whose error jumps: what the integers ruin."""
    p = scan.precision
    assert p is not None and scan.low is not None
    for op in p.origins:
        if p.downstream_of(scan.low.events, op.event.index, {site.event.index},
                           scan.settings.upstream_depth) is not None:
            return op
    return None


def findings(
    rule: SiteRule, sites: list[OpPrecision] | list[OpEvent], message: Callable[..., str],
    fix_title: str,
) -> list[Finding]:
    """One warning per site (op, file, line): the first of each."""
    found: list[Finding] = []
    seen: set[tuple[str, str, int]] = set()
    for site in sites:
        event = site.event if isinstance(site, OpPrecision) else site
        key = (event.op, event.location.file if event.location else "",
               event.location.line if event.location else 0)
        if key in seen:
            continue
        seen.add(key)
        found.append(advice_finding(
            rule, event, phase=Phase.FORWARD, message=message(site), fix_title=fix_title,
        ))
    return found
