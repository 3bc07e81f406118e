"""NH104: a large constant (an additive attention mask's -1e9) that FP16 cannot hold."""

from __future__ import annotations

from nan_hunter.findings import Kind, Phase
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register
from nan_hunter.trace.stats import format_number


def _too_large(c: Candidate) -> list[float]:
    return [v for v in c.event.scalars if abs(v) > c.fmt.max]


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
        return FixPlan(
            title=f"Use torch.finfo(tensor.dtype).{limit} instead of {format_number(value)}",
            rewrite="finfo",
            value=value,
        )
