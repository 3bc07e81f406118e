"""NH502 (warning): a large share of an op's low-precision output is subnormal."""

from __future__ import annotations

from nan_hunter.findings import Kind, Severity
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register
from nan_hunter.trace.stats import format_number


def subnormal_share(c: Candidate) -> float:
    tiny = sum(s.tiny or 0 for s in c.event.outputs)
    nonzero = sum(s.numel - (s.zeros or 0) - s.nonfinite for s in c.event.outputs)
    return tiny / nonzero if nonzero else 0.0


@register
class UnderflowShare(Rule):
    code = "NH502"
    name = "activation-underflow"
    severity = Severity.WARNING
    kind = Kind.UNDERFLOW
    summary = "Many values of an FP16 result are below FP16's smallest normal (6.1e-5)."
    doc = """\
## What
A configurable share (default 25%) of the nonzero values of an FP16 result lie below 6.1e-5,
FP16's smallest normal number: they keep only a few bits, and below 6e-8 they are 0.

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

    def matches(self, c: Candidate) -> bool:
        return False  # built directly by the warning scan

    def message(self, c: Candidate) -> str:
        share = subnormal_share(c)
        return (
            f"{format_number(share * 100)}% of the nonzero values of {c.event.op} are below the "
            f"{c.fmt.name} smallest normal {format_number(c.fmt.smallest_normal)} "
            "and lose precision or flush to 0"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title="Rescale these values or compute them in FP32")
