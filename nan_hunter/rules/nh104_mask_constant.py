"""NH104: a large constant (an additive attention mask's -1e9) that FP16 cannot hold."""

from __future__ import annotations

from nan_hunter.findings import Applicability, Kind, Phase
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register
from nan_hunter.trace.stats import format_number

FINITE_MASK = "1e4"
"""The mask constant maintainers use in FP16 (``-1e4``): it stays finite when scores, a bias or
a second mask are added to it, where ``finfo(float16).min`` (-65504) becomes -inf."""

_ADD_OR_SUB = frozenset({"add", "radd", "iadd", "sub", "rsub", "isub", "subtract"})


def _too_large(c: Candidate) -> list[float]:
    return [v for v in c.event.scalars if abs(v) > c.fmt.max]


def _added_to(c: Candidate) -> bool:
    """An add or a subtraction takes the masked value in the format (``scores + mask *
    -1e9``, a bias subtracted after ``masked_fill``): the dtype's limit would be ±inf there. A
    softmax's own max-subtraction is inside the softmax, not a traced op."""
    return any(
        e.op.rsplit(".", 1)[-1].strip("_") in _ADD_OR_SUB
        and any(s.dtype == c.fmt.name for s in e.outputs)
        for e in c.consumers
    )


@register
class MaskConstant(Rule):
    code = "NH104"
    name = "constant-beyond-fp16-range"
    priority = 15
    kind = Kind.OVERFLOW
    summary = "A constant such as an attention mask's -1e9 is beyond FP16's range."
    doc = """\
## What
A Python constant larger than 65504 in magnitude, typically the `-1e9` or `-1e4 * large` of an
additive attention mask, or `torch.finfo(torch.float32).min`, meets an FP16 tensor.
`masked_fill(mask, -1e9)` on FP16 raises "value cannot be converted to type at::Half without
overflow"; `scores + mask * -1e9` gives -inf, and a fully masked row then turns softmax into NaN.
nan-hunter reports the call and goes on as if the constant saturated to ±inf.

## Why
Masks are written for FP32, where -1e9 is an ordinary number. In FP16 it is out of range.

## Example
```python
scores = scores.masked_fill(mask == 0, -1e9)  # FP16 scores: RuntimeError, or -inf
```

## Fix
Use the dtype's own limit, `torch.finfo(scores.dtype).min`, or a boolean mask with
`F.scaled_dot_product_attention(..., attn_mask=mask)`. The patch replaces the constant with
`torch.finfo(<tensor>.dtype).min` (`.max` for a positive one), the limit of the tensor it meets.
Safe: in FP32 a masked score of -3.4e38 and one of -1e9 give the same softmax.

When an add or a subtraction takes the masked value in FP16 (an additive mask `scores + (1 -
m) * -1e9`, a bias subtracted after the fill), the limit is no fix: `-65504 - 40` is -inf, and a
fully masked row is NaN again. Then the constant becomes `-1e4`, as maintainers write FP16
masks (it stays finite after what follows, and `exp(-1e4)` is 0 in FP32 as `exp(-1e9)` is).
That changes the constant, so it is unsafe and measured like an eps (taken by default when the
FP32 loss moves less than 5%); the dtype's limit follows it as the alternative.
"""

    def matches(self, c: Candidate) -> bool:
        if c.phase is not Phase.FORWARD or not _too_large(c):
            return False
        if c.event.failure is not None:
            return c.event.failure.kind == "scalar_overflow"
        return any(s.dtype == c.fmt.name for s in c.event.outputs)

    def message(self, c: Candidate) -> str:
        value = format_number(_too_large(c)[0])
        if c.event.failure is not None:
            return (
                f"{c.event.op} is given the constant {value}, which {c.fmt.name} cannot hold: "
                "it raises 'cannot be converted ... without overflow' (the scan went on as if "
                f"it saturated: {'-inf' if _too_large(c)[0] < 0 else 'inf'} in {c.fmt.name})"
            )
        return (
            f"{c.event.op} is given the constant {value}, beyond the {c.fmt.name} maximum "
            f"{format_number(c.fmt.max)}: the result is ±inf"
        )

    def fix(self, c: Candidate) -> FixPlan:
        value = _too_large(c)[0]
        limit = "min" if value < 0 else "max"
        finite = (
            FixPlan(
                title=f"Use {'-' if value < 0 else ''}{FINITE_MASK} instead of "
                f"{format_number(value)}: finite in {c.fmt.name} after the add that follows "
                "(changes the numerics)",
                applicability=Applicability.UNSAFE,
                leads=True,
                rewrite="scalar",
                value=value,
                literal=f"{'-' if value < 0 else ''}{FINITE_MASK}",
            ),
        ) if _added_to(c) else ()
        return FixPlan(
            title=f"Use torch.finfo(tensor.dtype).{limit} instead of {format_number(value)}",
            rewrite="finfo",
            value=value,
            alternatives=finite,
        )
