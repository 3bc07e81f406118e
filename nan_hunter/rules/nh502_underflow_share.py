"""NH502 (warning): a share of an op's low-precision output (``underflow_share``, default 25%)
is subnormal."""

from __future__ import annotations

from nan_hunter.findings import Finding, Kind, Phase, Severity
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.project.config import Settings
from nan_hunter.rules.nh501_fp32_out_of_range import at_risk, site_findings
from nan_hunter.rules.registry import Candidate, FixPlan, ScanEvidence, SiteRule, register
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import format_number

_DEFAULTS = Settings()
SHARE = f"{_DEFAULTS.underflow_share:.0%}"
"""The default threshold as the docs say it (``25%``): the rule's description reads it from the
settings' defaults, so the text cannot drift from ``configs/default.yaml``."""


def subnormal_share(c: Candidate) -> float:
    tiny = sum(s.tiny or 0 for s in c.event.outputs)
    nonzero = sum(s.numel - (s.zeros or 0) - s.nonfinite for s in c.event.outputs)
    return tiny / nonzero if nonzero else 0.0


@register
class UnderflowShare(SiteRule):
    code = "NH502"
    name = "activation-underflow"
    severity = Severity.WARNING
    kind = Kind.UNDERFLOW
    summary = (
        f"At least {SHARE} of an FP16 result's nonzero values (underflow_share) are below FP16's "
        "smallest normal (6.1e-5)."
    )
    doc = f"""\
## What
At least a share `underflow_share` (default {SHARE}) of the nonzero values of an FP16 result,
and at least `underflow_min_count` (default {_DEFAULTS.underflow_min_count}) values, lie below
6.1e-5, FP16's smallest normal number: they keep only a few bits, and below 6e-8 they are 0.

## Why
Lost small values bias means and variances, and turn later divisions and logs into inf/NaN
(see NH201, NH202). Gradients suffer the same way without loss scaling.

## Example
```python
p = torch.softmax(scores, -1)                 # long sequences: most p ~ 1e-6
```

## Fix
Rescale the values, compute them in FP32, or use BF16. Display-only advice.
"""

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        """One warning per site whose low-precision output has a share ``underflow_share`` or
        more subnormal; a site NH501 warns about (enabled or not) is NH501's."""
        low = scan.low
        assert low is not None
        nh501 = {e.index for e in at_risk(low, scan.fmt)}
        events = [
            e for e in low.events
            if e.inputs_finite and e.outputs_finite and e.index not in nh501
            and _underflows(e, scan.fmt, scan.settings)
        ]
        return site_findings(self, scan, events)

    def message(self, c: Candidate) -> str:
        share = subnormal_share(c)
        return (
            f"{format_number(share * 100)}% of the nonzero values of {c.event.op} are below the "
            f"{c.fmt.name} smallest normal {format_number(c.fmt.smallest_normal)} "
            "and lose precision or flush to 0"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title="Rescale these values or compute them in FP32")


def _underflows(event: OpEvent, fmt: FloatFormat, settings: Settings) -> bool:
    if not any(s.dtype == fmt.name for s in event.outputs):
        return False
    tiny = sum(s.tiny or 0 for s in event.outputs)
    if tiny < settings.underflow_min_count:
        return False
    c = Candidate(phase=Phase.FORWARD, event=event, fmt=fmt)
    return subnormal_share(c) >= settings.underflow_share
