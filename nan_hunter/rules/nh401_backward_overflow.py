"""NH401: a gradient goes inf/NaN in backward while the forward was finite."""

from __future__ import annotations

from nan_hunter.findings import Kind, Phase
from nan_hunter.precision.gradients import scale_advice
from nan_hunter.rules._messages import fp32_reach, output_damage
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register
from nan_hunter.trace.stats import format_number

_CASTS = frozenset({"float", "half", "double", "bfloat16", "to", "type"})
"""Ops whose backward casts the incoming gradient and computes nothing."""


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
When a loss scale is what pushes the gradient over, lower it (`GradScaler(init_scale=...)`, which
also skips such steps): display-only advice. When the gradient overflows even unscaled (a steep
op: `pow(x, -k)` or `sqrt` near 0, `atan2`), the op runs in FP32 (an autocast-disabled region,
verified by re-scan), so that its backward does too. When the op is a custom
`autograd.Function` whose own `backward` overflows, the finding is at that `def backward` line
and the fix decorates the Function with `torch.amp.custom_fwd(cast_inputs=torch.float32)` and
`torch.amp.custom_bwd`, so that both halves run in FP32 under autocast (verified by re-scan).
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
        window = c.scale_window
        scale = f" at loss scale {format_number(c.grad_scale)}" if c.grad_scale != 1.0 else ""
        advice = f"; {scale_advice(window, c.fmt)}" if window is not None else ""
        received = "receives finite gradients and produces"
        if c.grad is not None and not all(s.finite for s in c.grad.incoming):
            received = "is the first to receive non-finite gradients (from the loss) and produces"
        op = c.event.op
        if c.event.custom_function:
            op = f"the custom autograd.Function {op.removesuffix('.apply')} (its own backward)"
        return (
            f"the backward of {op} {received} "
            f"{output_damage(c)}{scale}{fp32_reach(c)}{advice}"
        )

    def fix(self, c: Candidate) -> FixPlan:
        window = c.scale_window
        if c.grad_scale <= 1.0 and c.ref_finite and c.event.custom_function:
            # The Function's own backward overflows: no region around its call reaches code
            # that autograd runs later; torch.amp's decorators run both halves in FP32.
            name = c.event.op.removesuffix(".apply")
            return FixPlan(
                title=f"Run {name} in FP32 under autocast: torch.amp.custom_fwd(cast_inputs="
                "torch.float32) on its forward, torch.amp.custom_bwd on its backward",
                rewrite="custom_function",
            )
        if c.grad_scale <= 1.0 and c.ref_finite and c.op_name not in _CASTS:
            # No loss scale pushed it over: the backward overflows unscaled (a steep op near
            # 0, pow(x, -k), atan2): the op's own backward has to run in FP32. Not for a cast:
            # its backward only casts the gradient it receives, which the loss made too large.
            return FixPlan(
                title=f"Compute {c.event.op} in FP32 (autocast disabled), so that its backward "
                "runs in FP32 too",
                region=True,
            )
        if window is not None and window.recommended is not None:
            return FixPlan(
                title=f"Use torch.amp.GradScaler(init_scale=2**{window.recommended}) "
                "(it also skips steps whose gradients overflow)"
            )
        return FixPlan(
            title="Lower the loss weight or loss scale (GradScaler skips such steps), "
            f"or compute {c.event.op} in FP32"
        )
