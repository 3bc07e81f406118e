"""NH201: a small constant (eps) that is 0 in low precision makes a later op non-finite."""

from __future__ import annotations

from nan_hunter.findings import Kind, Phase
from nan_hunter.rules._eps import eps_rewrite
from nan_hunter.rules._messages import output_damage, upstream_site
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register
from nan_hunter.trace.stats import format_number


def _vanishing_scalars(c: Candidate) -> list[float]:
    if c.upstream is None:
        return []
    return [v for v in c.upstream.event.scalars if c.fmt.rounds_to_zero(v)]


@register
class EpsUnderflow(Rule):
    code = "NH201"
    name = "eps-underflow"
    priority = 25
    kind = Kind.UNDERFLOW
    summary = "An eps such as 1e-8 is 0 in FP16, so a later division or log is not guarded."
    doc = """\
## What
A Python scalar below FP16's smallest subnormal (about 6e-8), typically an `eps` of `1e-8` or
`1e-12`, is added to an FP16 tensor. In FP16 it rounds to 0, so the guard it was meant to be is
gone: a later division gives 0/0 = NaN or x/0 = inf, a later log gives -inf.

## Why
The op that goes non-finite is fine in FP32 and even in FP32 on its FP16 inputs: the damage was
done upstream, where `m + 1e-8` returned `m` unchanged.

## Example
```python
denom = m + 1e-8                              # FP16: 1e-8 -> 0
y = x / denom                                 # 0 / 0 -> NaN where m == 0
```

## Fix
Use an eps FP16 can hold (>= 6.1e-5, FP16's smallest normal: `1e-4`), or compute the guarded
expression in FP32. The constant is the cause, so its change comes first: the patch writes the
eps as `1e-4` where the number is written (the line itself, or the one place the file writes
it: `self.eps = 1e-8`, a default `eps=1e-8`). That is unsafe (it changes the numerics): the
verification measures by how much the FP32 loss moves, and `--fix`/`--fix-all` take it without
`--unsafe-fixes` when that is within the verification's 5% (the report says "unsafe, measured:
FP32 loss changes by 0.02%"). Otherwise they take the next fix: an autocast-disabled region
around the eps statement and the culprit with `.float()` operands (safe: the FP32 numerics are
kept), grown when needed. When the true gradient of `x / eps` cannot fit FP16 (NH401 after the
region), only the larger eps fixes the model.
"""

    def matches(self, c: Candidate) -> bool:
        return (
            c.phase is Phase.FORWARD
            and c.ref_finite is True
            and c.upstream is not None
            and bool(_vanishing_scalars(c))
        )

    def message(self, c: Candidate) -> str:
        assert c.upstream is not None
        eps = format_number(_vanishing_scalars(c)[0])
        where = c.upstream.event.location
        line = f" at line {where.line}" if where else ""
        return (
            f"{c.event.op} gets {output_damage(c)} because the eps {eps} in "
            f"{c.upstream.event.op}{line} is 0 in {c.fmt.name}; in FP32 the op is finite"
        )

    def fix(self, c: Candidate) -> FixPlan:
        assert c.upstream is not None
        where = c.upstream.event.location
        same_file = where is not None and c.event.location is not None and (
            where.file == c.event.location.file
        )
        eps = _vanishing_scalars(c)[0]
        alternatives = ()
        if same_file and where is not None:
            alternatives = (eps_rewrite(c.fmt, eps, where.line),)
        return FixPlan(
            title="Compute the eps-guarded expression in FP32 (autocast disabled)",
            region=True,
            extra_lines=(where.line,) if same_file and where is not None else (),
            upcast_sites=upstream_site(c) if same_file else (),
            alternatives=alternatives,
        )
