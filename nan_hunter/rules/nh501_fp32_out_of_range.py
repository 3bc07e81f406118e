"""NH501 (warning): an FP32 result beyond the low-precision range, not (yet) cast down."""

from __future__ import annotations

from nan_hunter.findings import Kind, Severity
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register
from nan_hunter.trace.stats import format_number


@register
class Fp32OutOfRange(Rule):
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

    def matches(self, c: Candidate) -> bool:
        return False  # built directly by the warning scan

    def message(self, c: Candidate) -> str:
        largest = max((s.abs_max or 0.0) for s in c.event.outputs)
        return (
            f"{c.event.op} produces FP32 values up to |x| = {format_number(largest)}, above the "
            f"{c.fmt.name} maximum {format_number(c.fmt.max)}; they become inf if cast to "
            f"{c.fmt.name}"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title="Keep the consumers of this value in FP32, or rescale it")
