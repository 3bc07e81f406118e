"""NH103: hand-written statistics (x * x, sums of squares) overflowing in low precision."""

from __future__ import annotations

from nan_hunter.findings import Kind
from nan_hunter.rules._messages import fp32_reach, output_damage
from nan_hunter.rules._overflow import RangeOverflowRule
from nan_hunter.rules.registry import Candidate, register

STATISTICS_OPS = frozenset(
    {"mul", "imul", "rmul", "square", "pow", "ipow", "sum", "norm", "var", "std", "cumsum"}
)


@register
class StatisticsOverflow(RangeOverflowRule):
    code = "NH103"
    name = "hand-written-statistics-overflow"
    priority = 31
    kind = Kind.OVERFLOW
    ops = STATISTICS_OPS
    summary = "A hand-written square, sum of squares or product overflows FP16."
    doc = """\
## What
An elementwise product or reduction written by hand, such as `(x * x).mean(-1)` in an RMSNorm,
overflows FP16: a value of 256 squared is already 65536.

## Why
Under CUDA autocast `mul` is not on any list, so `x * x` of an FP16 tensor stays FP16, while
`x.pow(2)`, `layer_norm` and `rms_norm` are run in FP32. The hand-written form is the one that
breaks.

## Example
```python
ms = (x * x).mean(-1, keepdim=True)           # x ~ 300 in FP16 -> inf
```

## Fix
Compute the statistic in FP32: `x.float()` (the patch wraps the statement in an autocast-disabled
region with `.float()` operands), or use `torch.nn.functional.rms_norm` / `layer_norm`. Safe.
"""

    def message(self, c: Candidate) -> str:
        return (
            f"{c.event.op} of {c.fmt.name} values overflows and gets "
            f"{output_damage(c)}{fp32_reach(c)}"
        )
