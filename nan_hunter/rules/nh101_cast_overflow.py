"""NH101: an FP32 value beyond the low-precision range, cast down by autocast."""

from __future__ import annotations

from nan_hunter.findings import Kind, Phase
from nan_hunter.rules._messages import output_damage
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register
from nan_hunter.trace.stats import format_number


@register
class CastOverflow(Rule):
    code = "NH101"
    name = "fp32-value-cast-overflow"
    priority = 20
    kind = Kind.OVERFLOW
    summary = "An FP32 tensor above the FP16 maximum is cast to FP16 by autocast and becomes inf."
    doc = """\
## What
An op that autocast runs in FP16 (matmul, linear, conv, bmm, ...) receives an FP32 tensor whose
values exceed 65504, FP16's largest finite value. Autocast casts it to FP16, where those values
become inf, and the op's output turns inf/NaN.

## Why
Ops such as `torch.inverse` run in FP32 (on CUDA they fail in FP16, so users compute them in
FP32), but their result is often large: the inverse of a near-singular matrix easily holds
entries of 1e5 or more. The next matmul is on autocast's FP16 list and casts it back down.

## Example
```python
dtd_inv = torch.inverse(dtd + lam * eye)      # FP32, entries ~1e6
codes = torch.matmul(dtd_inv, z)              # autocast casts dtd_inv to FP16 -> inf
```

## Fix
Run the producer and the consumer in FP32: wrap both statements in
`with torch.autocast(device_type=..., enabled=False):` and call `.float()` on the tensor operands.
The patch nan-hunter writes does exactly this. Safe: it only raises precision.
"""

    def matches(self, c: Candidate) -> bool:
        return c.phase is Phase.FORWARD and bool(c.cast_inputs)

    def message(self, c: Candidate) -> str:
        largest = max(c.event.inputs[i].abs_max or 0.0 for i in c.cast_inputs)
        return (
            f"{c.event.op} receives an FP32 operand with |x| up to {format_number(largest)}, "
            f"above the {c.fmt.name} maximum {format_number(c.fmt.max)}; autocast casts it to "
            f"{c.fmt.name} and the output gets {output_damage(c)}"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(
            title=f"Run {c.event.op} and the op producing its large operand in FP32 "
            "(autocast disabled, .float() operands)",
            region=True,
            extra_lines=c.producer_lines,
        )
