"""NH401: a gradient goes inf/NaN in backward while the forward was finite."""

from __future__ import annotations

from nan_hunter.findings import Kind, Phase
from nan_hunter.rules._messages import fp32_reach, output_damage
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register


@register
class BackwardNonFinite(Rule):
    code = "NH401"
    name = "gradient-overflow"
    priority = 40
    kind = Kind.INF
    summary = "The backward of an op produces an inf/NaN gradient in FP16 that FP32 does not."
    doc = """\
## What
During backward, an op receives finite gradients but produces inf or NaN ones in FP16, while the
same backward is finite in FP32. The report names the forward op, module and line whose backward
produced them.

## Why
Gradients flow back in the dtype of the forward activations. A large loss weight, a large loss
scale or a steep function (exp, pow, division by a small value) makes them exceed 65504.

## Example
```python
out32 = out.float()                           # backward casts the gradient back to FP16
loss = out32.sum() * 1e5                      # dloss/dout = 1e5 > 65504 -> inf
```

## Fix
Lower the loss weight or the loss scale (`GradScaler(init_scale=...)`, which also skips such steps),
or compute the op in FP32 so its gradient is FP32. Review needed: display-only advice.
"""

    def matches(self, c: Candidate) -> bool:
        return c.phase is Phase.BACKWARD

    def kind_for(self, c: Candidate) -> Kind:
        ref = c.ref_abs_max
        if ref is not None and ref > c.fmt.max:
            return Kind.OVERFLOW
        stats = c.grad.produced if c.grad is not None else ()
        return Kind.NAN if any(s.nan for s in stats) else Kind.INF

    def message(self, c: Candidate) -> str:
        return (
            f"the backward of {c.event.op} receives finite gradients and produces "
            f"{output_damage(c)}{fp32_reach(c)}"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(
            title="Lower the loss weight or loss scale (GradScaler skips such steps), "
            f"or compute {c.event.op} in FP32"
        )
