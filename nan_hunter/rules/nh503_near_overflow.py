"""NH503 (warning, opt-in): a forward value within ``min_headroom`` of the format's maximum."""

from __future__ import annotations

from nan_hunter.engine.range_map import at_risk_output
from nan_hunter.findings import Finding, Kind, Severity
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.rules.nh501_fp32_out_of_range import site_findings
from nan_hunter.rules.registry import Candidate, FixPlan, ScanEvidence, SiteRule, register
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import format_number


@register
class NearOverflow(SiteRule):
    code = "NH503"
    name = "near-overflow"
    severity = Severity.WARNING
    kind = Kind.OVERFLOW
    summary = "A forward value is within --min-headroom of the FP16 maximum (off by default)."
    doc = """\
## What
With `--min-headroom X` (or `min-headroom = X` in `[tool.nan-hunter]`), an op whose forward
output reaches |x| above 65504 / X is reported, although it is still finite: it has less
than a factor X of room before it overflows. Off by default (`min_headroom: 0`).

## Why
A scan sees the model at one step. Activations grow while it trains (weights drift, norms
grow); values at 1e4 today are inf a few epochs later. A CI gate with a margin turns red
while the model is still healthy. X = 8 to 16 covers the growth usually seen over a run.

## Example
```python
h = self.fc(x)                                # |h| up to 9.2e3: 7.1x below 65504
```

## Fix
Normalise or rescale the values (a LayerNorm, a smaller init, `/ sqrt(d)`), or run the op
in FP32 or BF16. Display-only advice.
"""

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        """One warning per site whose finite forward output is within the margin; values
        already beyond the maximum are the other rules' (NH1xx, NH501)."""
        factor = scan.settings.min_headroom
        low = scan.low
        if factor <= 1.0 or low is None:
            return []
        events = [
            e for e in low.events
            if e.inputs_finite and e.outputs_finite and _near(e, scan.fmt, factor)
        ]
        return site_findings(self, scan, events)

    def message(self, c: Candidate) -> str:
        largest = max(
            (s.abs_max or 0.0 for s in c.event.outputs if at_risk_output(c.event, s, c.fmt)),
            default=0.0,
        )
        room = c.fmt.max / largest if largest else float("inf")
        return (
            f"{c.event.op} reaches |x| = {format_number(largest)}, within "
            f"{format_number(room)}x of the {c.fmt.name} maximum {format_number(c.fmt.max)}"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title="Normalise or rescale these values, or compute them in FP32/BF16")


def _near(event: OpEvent, fmt: FloatFormat, factor: float) -> bool:
    return any(
        s.abs_max is not None and fmt.max / factor < s.abs_max <= fmt.max
        for s in event.outputs
        if at_risk_output(event, s, fmt)
    )
