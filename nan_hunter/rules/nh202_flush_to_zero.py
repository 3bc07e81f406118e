"""NH202: values that flush to zero in low precision make a later op non-finite."""

from __future__ import annotations

from nan_hunter.findings import Kind, Phase
from nan_hunter.rules._eps import eps_rewrite
from nan_hunter.rules._messages import output_damage, upstream_site
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register
from nan_hunter.trace.summary import format_number


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

The same zero comes from a subtraction of values that are equal in FP16 (`1 - p` where `p` is
0.99999 in FP32 and 1.0 in FP16): two different FP16 numbers never subtract to 0, so such zeros
are the operands' rounding, and the report names it so, with the Python numbers on the way that
FP16 turns into 0 or ±1 (`x * (1 - 1e-5)` is `x` in FP16).

## Why
Probabilities from a sigmoid or softmax, variances and norms of small activations underflow
quietly in FP16; nothing is wrong until a `log` or `/` meets the zero. Near 1, FP16 steps by
4.9e-4: `1 - p` for a confident probability is 0.

## Example
```python
p = torch.sigmoid(logits)                     # FP16: sigmoid(-20) = 2e-9 -> 0
nll = -torch.log(p)                           # log(0) = -inf
```

## Fix
Compute the small values and their consumer in FP32 (the patch wraps both in an
autocast-disabled region with `.float()` operands), or use a fused, stable form
(`logsigmoid`, `log_softmax`, `binary_cross_entropy_with_logits`). Safe.

When an add on the way has an eps FP16 cannot hold as a normal number (`torch.sqrt(var +
1e-9)`: 0 in FP16, so a zero variance stays 0 and the division is 0/0), the eps is the cause:
the fix writes it as `1e-4` where the number is written (as NH201's does: unsafe, its FP32 loss
change measured, taken by default when within 5%), and the FP32 regions follow it as
alternatives.
"""

    def matches(self, c: Candidate) -> bool:
        return (
            c.phase is Phase.FORWARD
            and c.ref_finite is True
            and c.upstream is not None
            and c.upstream.reason in ("flush", "cancel")
        )

    def kind_for(self, c: Candidate) -> Kind:
        """A cancellation whose FP32 difference FP16 could hold at full precision is no
        underflow: the op's output damage is the kind then."""
        assert c.upstream is not None
        if c.upstream.reason == "cancel" and _smallest_difference(c) >= c.fmt.smallest_normal:
            return Kind.NAN if any(s.nan for s in c.event.outputs) else Kind.INF
        return self.kind

    def message(self, c: Candidate) -> str:
        assert c.upstream is not None
        up = c.upstream.event
        line = f" at line {up.location.line}" if up.location else ""
        if c.upstream.reason == "cancel":
            return (
                f"{c.event.op} gets {output_damage(c)} because {up.op}{line} subtracts values "
                f"that are equal in {c.fmt.name}{_fp32_difference(c)}{_constants(c)}; "
                "in FP32 the op is finite"
            )
        return (
            f"{c.event.op} gets {output_damage(c)} because {up.op}{line} flushed small values "
            f"to 0 in {c.fmt.name}; in FP32 the op is finite"
        )

    def fix(self, c: Candidate) -> FixPlan:
        assert c.upstream is not None
        up = c.upstream.event.location
        here = c.event.location
        same_file = up is not None and here is not None and up.file == here.file
        what = "subtraction" if c.upstream.reason == "cancel" else "underflowing values"
        lost = c.upstream.lost_eps
        eps_at = lost.event.location if lost is not None else None
        leads = ()
        if lost is not None and eps_at is not None and here is not None and (
            eps_at.file == here.file
        ):
            leads = (eps_rewrite(c.fmt, lost.value, eps_at.line),)
        return FixPlan(
            title=f"Compute the {what} and their consumer in FP32",
            region=True,
            extra_lines=(up.line,) if same_file and up is not None else (),
            upcast_sites=upstream_site(c) if same_file else (),
            alternatives=leads,
        )


def _smallest_difference(c: Candidate) -> float:
    """The smallest |x| of the subtraction's FP32 result when its values share a sign (0 when
    they do not, or are not known): what FP16 had to hold."""
    assert c.upstream is not None
    ref = c.upstream.reference
    outputs = ref.outputs if ref is not None else ()
    if len(outputs) != 1 or outputs[0].min is None or outputs[0].max is None:
        return 0.0
    low, high = outputs[0].min, outputs[0].max
    if low > 0:
        return low
    if high < 0:
        return -high
    return 0.0


def _fp32_difference(c: Candidate) -> str:
    smallest = _smallest_difference(c)
    if smallest == 0.0:
        return " (FP32 keeps their difference)"
    return f" (in FP32 their difference is {format_number(smallest)} or more)"


def _constants(c: Candidate) -> str:
    """``: the constant 0.99999 at line 13 is 1 in float16``, for each such number found."""
    assert c.upstream is not None
    named = []
    for k in c.upstream.constants[:2]:
        at = f" at line {k.event.location.line}" if k.event.location else ""
        named.append(
            f"the constant {k.value!r}{at} is {format_number(k.rounded)} in "
            f"{c.fmt.name}"
        )
    return ": " + ", and ".join(named) if named else ""
