"""NH501 (warning): an FP32 result beyond the low-precision range, not (yet) cast down."""

from __future__ import annotations

from nan_hunter.engine.analysis import cast_inputs, forward_origins
from nan_hunter.engine.runner import PassResult
from nan_hunter.findings import Finding, Kind, Phase, Severity
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.rules.registry import (
    Candidate,
    FixPlan,
    ScanEvidence,
    SiteRule,
    advice_finding,
    register,
)
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import format_number


@register
class Fp32OutOfRange(SiteRule):
    code = "NH501"
    name = "fp32-value-out-of-range"
    severity = Severity.WARNING
    kind = Kind.OUT_OF_RANGE
    summary = "An FP32 result exceeds the FP16 maximum; it becomes inf if autocast casts it."
    doc = """\
## What
An op's FP32 output holds values above 65504. Nothing is wrong yet, but the first op on
autocast's FP16 list that reads it (matmul, linear, conv, ...) will turn them into inf.

## Why
It is the typical precursor of NH101; it also breaks `model.half()` inference outright.

## Example
```python
y = torch.exp(x)                              # FP32 under autocast, y ~ 1.6e5
```

## Fix
Keep the consumers of this value in FP32 too, or rescale it. Display-only advice.
"""

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        """One warning per site (op and source line) whose FP32 result is at risk."""
        assert scan.low is not None
        return site_findings(self, scan, at_risk(scan.low, scan.fmt))

    def message(self, c: Candidate) -> str:
        largest = max((s.abs_max or 0.0) for s in c.event.outputs)
        return (
            f"{c.event.op} produces FP32 values up to |x| = {format_number(largest)}, above the "
            f"{c.fmt.name} maximum {format_number(c.fmt.max)}; they become inf if cast to "
            f"{c.fmt.name}"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title="Keep the consumers of this value in FP32, or rescale it")


def at_risk(low: PassResult, fmt: FloatFormat) -> list[OpEvent]:
    """The finite ops whose FP32 result is beyond ``fmt``'s range, leaves its module (a later
    layer may cast it) and is not already blamed on an NH101 cast, in pass order."""
    cast_producers = _cast_chains(low, fmt)
    return [
        event
        for event in low.events
        if event.inputs_finite and event.outputs_finite
        and event.index in low.escaped
        and event.index not in cast_producers
        and _out_of_range_at_risk(event, fmt)
    ]


def site_findings(rule: SiteRule, scan: ScanEvidence, events: list[OpEvent]) -> list[Finding]:
    """One forward warning of ``rule`` per site (op, file, line) among ``events``: the first."""
    found: list[Finding] = []
    seen: set[tuple[str, str, int]] = set()
    for event in events:
        site = (event.op, event.location.file if event.location else "",
                event.location.line if event.location else 0)
        if site in seen:
            continue
        seen.add(site)
        c = Candidate(phase=Phase.FORWARD, event=event, fmt=scan.fmt)
        plan = rule.fix(c)
        found.append(
            advice_finding(
                rule,
                event,
                phase=Phase.FORWARD,
                message=rule.message(c),
                fix_title=plan.title if plan else None,
            )
        )
    return found


def _cast_chains(low: PassResult, fmt: FloatFormat) -> set[int]:
    """Ops whose out-of-range output reaches an NH101 cast, directly or through ops that pass
    the value on (ReLU, an eval-mode Dropout): NH101 already blames them, no NH501 too."""
    found: set[int] = set()
    stack = [
        e.producers[i]
        for e in forward_origins(low)
        for i in cast_inputs(e, fmt)
        if e.producers[i] is not None
    ]
    while stack:
        index = stack.pop()
        if index is None or index in found:
            continue
        event = low.events[index]
        if not any(s.exceeds(fmt.max) for s in event.outputs):
            continue
        found.add(index)
        stack.extend(
            p for p, s in zip(event.producers, event.inputs, strict=False) if s.exceeds(fmt.max)
        )
    return found


def _out_of_range_at_risk(event: OpEvent, fmt: FloatFormat) -> bool:
    """An FP32 result beyond ``fmt``'s range, made by this op (not passed through from an
    input), where autocast is on and could cast it down. Loss ops and FP32 regions the user
    opened with ``autocast(enabled=False)`` are not at risk; the caller also requires that the
    value leaves its module, so that a later layer may cast it (values that FP32 ops consume
    inside the module, as ``x.pow(2).mean()`` in a norm, are not at risk)."""
    if event.in_loss or not event.autocast:
        return False
    largest_in = max((s.abs_max or 0.0 for s in event.inputs), default=0.0)
    return any(
        s.dtype == "float32" and s.exceeds(fmt.max) and (s.abs_max or 0.0) > largest_in
        for s in event.outputs
    )
