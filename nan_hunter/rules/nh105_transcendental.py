"""NH105: exp/log/softmax family overflowing or hitting log(0) in low precision."""

from __future__ import annotations

from nan_hunter.findings import Kind, Phase
from nan_hunter.rules._messages import fp32_reach, output_damage, rounded_region
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register

TRANSCENDENTAL = frozenset(
    {
        "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "softmax", "log_softmax",
        "logsumexp", "sigmoid", "softplus", "cosh", "sinh", "tan", "reciprocal", "rsqrt",
    }
)  # fmt: skip


@register
class TranscendentalOverflow(Rule):
    code = "NH105"
    name = "exp-log-in-low-precision"
    priority = 29
    kind = Kind.OVERFLOW
    summary = "exp / log / softmax overflow or log(0) when computed in FP16 (half mode)."
    doc = """\
## What
An exponential, logarithm or softmax computed in FP16 goes inf/NaN: `exp(x)` overflows for
x > 11.1, `log` of a value that rounded to 0 is -inf, a softmax over inf is NaN. Under CUDA
autocast these ops run in FP32, so this shows in `model.half()` (`--mode half`) or where a
tensor is explicitly FP16.

## Why
FP16's range ends at 65504 = exp(11.09); its smallest subnormal is 6e-8 = exp(-16.6).

## Example
```python
model = model.half()
probs = torch.exp(logits)                     # logits > 11 -> inf
```

## Fix
Compute the op in FP32 (the patch wraps the statement in an autocast-disabled region with
`.float()` operands), or use the fused, stable forms: `log_softmax`, `logsumexp`,
`F.logsigmoid`. Safe.
"""

    def matches(self, c: Candidate) -> bool:
        return (
            c.phase is Phase.FORWARD
            and c.op_name in TRANSCENDENTAL
            and c.ref_finite is True
            and any(s.dtype == c.fmt.name for s in c.event.inputs)
        )

    def kind_for(self, c: Candidate) -> Kind:
        if c.ref_abs_max is not None and c.ref_abs_max > c.fmt.max:
            return Kind.OVERFLOW
        return Kind.NAN if any(s.nan for s in c.event.outputs) else Kind.INF

    def message(self, c: Candidate) -> str:
        return (
            f"{c.event.op} computed in {c.fmt.name} gets {output_damage(c)}{fp32_reach(c)}"
        )

    def fix(self, c: Candidate) -> FixPlan:
        if c.own_inputs_finite is False:
            # FP32 fails on the op's own rounded inputs: the region starts where they rounded
            lines, sites = rounded_region(c)
            return FixPlan(
                title=f"Compute {c.event.op} and the ops that rounded its input in FP32",
                region=True,
                extra_lines=lines,
                upcast_sites=sites,
            )
        return FixPlan(title=f"Compute {c.event.op} in FP32 (autocast disabled)", region=True)
