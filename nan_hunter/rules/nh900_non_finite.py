"""NH900: the generic non-finite origin, when no more specific rule explains it."""

from __future__ import annotations

from nan_hunter.findings import Kind
from nan_hunter.rules._messages import fp32_reach, output_damage, rounded_region
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register


@register
class NonFiniteOrigin(Rule):
    code = "NH900"
    name = "non-finite-origin"
    priority = 99
    kind = Kind.NAN
    summary = "An op receives finite inputs and produces NaN or inf in low precision only."
    doc = """\
## What
The first op whose inputs are all finite but whose output holds NaN or inf in FP16, while the same
op is finite in the FP32 reference run. No more specific rule recognised the pattern.

## Why
Something in this op's computation does not fit FP16's range or precision.

## Example
```python
y = torch.special.some_function(x)            # finite in FP32, NaN in FP16
```

## Fix
Compute the op in FP32 (the patch wraps the statement in an autocast-disabled region with
`.float()` operands). Safe: it only raises precision.
"""

    def matches(self, c: Candidate) -> bool:
        return True

    def kind_for(self, c: Candidate) -> Kind:
        stats = c.grad.produced if c.grad is not None else c.event.outputs
        return Kind.NAN if any(s.nan for s in stats) else Kind.INF

    def message(self, c: Candidate) -> str:
        return f"{c.event.op} receives finite inputs and gets {output_damage(c)}{fp32_reach(c)}"

    def fix(self, c: Candidate) -> FixPlan | None:
        if c.ref_finite is not True:
            return None
        if c.own_inputs_finite is False:
            # Even FP32 fails on the op's own FP16 inputs: the precision was lost upstream, so
            # the ops that made those inputs go into the FP32 region too.
            lines, sites = rounded_region(c)
            return FixPlan(
                title=f"Compute {c.event.op} and the ops feeding it in FP32 (autocast disabled)",
                region=True,
                extra_lines=lines,
                upcast_sites=sites,
            )
        return FixPlan(title=f"Compute {c.event.op} in FP32 (autocast disabled)", region=True)
