"""NH109: any other op whose result exceeds the low-precision range."""

from __future__ import annotations

from nan_hunter.findings import Kind
from nan_hunter.rules._overflow import RangeOverflowRule
from nan_hunter.rules.registry import register


@register
class OpOverflow(RangeOverflowRule):
    code = "NH109"
    name = "op-output-overflow"
    priority = 39
    kind = Kind.OVERFLOW
    summary = "An op's result is finite in FP32 but exceeds the FP16 maximum."
    doc = """\
## What
An op whose result is finite in FP32 produces values beyond 65504 in FP16, which become inf.

## Why
Exponentials, large sums and products of large activations leave FP16's narrow range while FP32
holds them easily.

## Example
```python
y = torch.exp(x)                              # x ~ 12 in FP16 -> exp(12) = 1.6e5 -> inf
```

## Fix
Compute the op in FP32 (the patch wraps the statement in an autocast-disabled region with
`.float()` operands), rescale the values, or use BF16. The FP32 region is safe.
"""
