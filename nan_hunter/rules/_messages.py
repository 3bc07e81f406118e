"""Shared wording for rule messages."""

from __future__ import annotations

from nan_hunter.rules.registry import Candidate
from nan_hunter.trace.stats import format_number


def fp32_reach(c: Candidate) -> str:
    """``"reaches 1.2e+05 in FP32"`` from the FP32 reference, or "" when there is none."""
    if c.ref_abs_max is None:
        return ""
    return f"; in FP32 it reaches |x| = {format_number(c.ref_abs_max)}"


def output_damage(c: Candidate) -> str:
    stats = c.grad.produced if c.grad is not None else c.event.outputs
    nan = sum(s.nan for s in stats)
    inf = sum(s.posinf + s.neginf for s in stats)
    parts = [f"{inf} inf"] if inf else []
    if nan:
        parts.append(f"{nan} NaN")
    return " and ".join(parts) if parts else "non-finite values"


def upstream_site(c: Candidate) -> tuple[tuple[int, str, int], ...]:
    """The upstream op as a ``(line, op, n_operands)`` site whose operands the fix upcasts."""
    if c.upstream is None or c.upstream.event.location is None:
        return ()
    up = c.upstream.event
    assert up.location is not None
    return ((up.location.line, up.op, len(up.inputs)),)


def rounded_region(c: Candidate) -> tuple[tuple[int, ...], tuple[tuple[int, str, int], ...]]:
    """``(extra_lines, upcast_sites)`` taking the already-rounded upstream ops into the region
    (``Candidate.rounded_chain``) together with the op's direct producers in its file."""
    here = c.event.location
    ops = {e.index: e for e in c.rounded_chain}
    for p in c.input_producers:
        if p.location is not None and here is not None and p.location.file == here.file:
            ops.setdefault(p.index, p)
    chain = [ops[i] for i in sorted(ops)]
    lines = tuple(dict.fromkeys(e.location.line for e in chain if e.location))
    sites = tuple((e.location.line, e.op, len(e.inputs)) for e in chain if e.location)
    return lines, sites
