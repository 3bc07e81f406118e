"""NH202: values that flush to zero in low precision make a later op non-finite."""

from __future__ import annotations

from nan_hunter.findings import Kind, Phase
from nan_hunter.rules._messages import output_damage, upstream_site
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register


@register
class FlushToZero(Rule):
    code = "NH202"
    name = "flush-to-zero"
    priority = 26
    kind = Kind.UNDERFLOW
    summary = "Small values become 0 in FP16 upstream, and a later log or division fails."
    doc = """\
## What
An earlier op's result holds values below FP16's smallest subnormal (about 6e-8) that become 0.
A later op divides by them or takes their log and goes inf/NaN, while in FP32 it is finite.

## Why
Probabilities from a sigmoid or softmax, variances and norms of small activations underflow
quietly in FP16; nothing is wrong until a `log` or `/` meets the zero.

## Example
```python
p = torch.sigmoid(logits)                     # FP16: sigmoid(-20) = 2e-9 -> 0
nll = -torch.log(p)                           # log(0) = -inf
```

## Fix
Compute the small values and their consumer in FP32 (the patch wraps both in an
autocast-disabled region with `.float()` operands), or use a fused, stable form
(`logsigmoid`, `log_softmax`, `binary_cross_entropy_with_logits`). Safe.
"""

    def matches(self, c: Candidate) -> bool:
        return (
            c.phase is Phase.FORWARD
            and c.ref_finite is True
            and c.upstream is not None
            and c.upstream.reason == "flush"
        )

    def message(self, c: Candidate) -> str:
        assert c.upstream is not None
        up = c.upstream.event
        line = f" at line {up.location.line}" if up.location else ""
        return (
            f"{c.event.op} gets {output_damage(c)} because {up.op}{line} flushed small values "
            f"to 0 in {c.fmt.name}; in FP32 the op is finite"
        )

    def fix(self, c: Candidate) -> FixPlan:
        assert c.upstream is not None
        up = c.upstream.event.location
        here = c.event.location
        same_file = up is not None and here is not None and up.file == here.file
        return FixPlan(
            title="Compute the underflowing values and their consumer in FP32",
            region=True,
            extra_lines=(up.line,) if same_file and up is not None else (),
            upcast_sites=upstream_site(c) if same_file else (),
        )
