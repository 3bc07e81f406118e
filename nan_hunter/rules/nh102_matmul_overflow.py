"""NH102: a matmul/linear/conv/bmm result beyond the low-precision range."""

from __future__ import annotations

from nan_hunter.findings import Kind
from nan_hunter.rules._overflow import RangeOverflowRule
from nan_hunter.rules.registry import register

MATMUL_FAMILY = frozenset(
    {
        "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv", "mv", "einsum", "linear",
        "bilinear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "scaled_dot_product_attention", "chain_matmul", "multi_dot",
        "tensordot", "rmatmul", "imatmul",
    }
)  # fmt: skip


@register
class MatmulOverflow(RangeOverflowRule):
    code = "NH102"
    name = "matmul-output-overflow"
    priority = 30
    kind = Kind.OVERFLOW
    ops = MATMUL_FAMILY
    summary = "A matmul, linear, conv or bmm result exceeds the FP16 maximum."
    doc = """\
## What
A matrix product computed in FP16 under autocast has entries above 65504. The GEMM accumulates in
FP32 but rounds its output to FP16, where they become inf; softmax or a norm after it turns them
into NaN.

## Why
Large activations are common: attention scores without the `1 / sqrt(d)` scaling, T5-style
feed-forward layers whose activations grow with depth, a conv before GroupNorm.

## Example
```python
scores = q @ k.transpose(-2, -1)              # no / math.sqrt(d): |scores| ~ 1e5
attn = scores.softmax(-1)                     # inf - inf -> NaN
```

## Fix
Compute the product in FP32 (the patch wraps the statement in an autocast-disabled region with
`.float()` operands), or rescale it (attention: divide q by `sqrt(d)` before the matmul), or use
BF16, whose range matches FP32. The FP32 region is safe; rescaling changes the model.
"""
