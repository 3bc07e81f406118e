"""NH303: linear algebra (inverse, solve, cholesky, svd, ...) given FP16 tensors."""

from __future__ import annotations

from nan_hunter.findings import Kind
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register


@register
class LowPrecisionLinalg(Rule):
    code = "NH303"
    name = "fp16-linear-algebra"
    priority = 6
    kind = Kind.UNSUPPORTED_DTYPE
    summary = "inverse / solve / cholesky / svd receive FP16 tensors and fail on CUDA."
    doc = """\
## What
A linear-algebra op (`torch.inverse`, `torch.linalg.inv`, `solve`, `cholesky`, `svd`, ...)
receives FP16 tensors, typically the output of a matmul that autocast ran in FP16. On CUDA it
raises `Low precision dtypes not supported. Got Half`. CPU autocast silently runs these ops in
FP32, so a CPU test passes. nan-hunter reports the call and goes on with it in FP32.

## Why
These algorithms need FP32's precision and range: the inverse of a near-singular matrix easily
exceeds 65504, and pivoting in FP16 loses the answer.

## Example
```python
gram = feats.T @ feats                        # FP16 under autocast
inv = torch.inverse(gram + lam * eye)         # RuntimeError on CUDA
```

## Fix
Compute the op and the matmul feeding it in FP32: wrap both in
`with torch.autocast(device_type="cuda", enabled=False):` with `.float()` operands. Safe.
"""

    def matches(self, c: Candidate) -> bool:
        return c.event.failure is not None and c.event.failure.kind == "unsupported_dtype"

    def message(self, c: Candidate) -> str:
        return (
            f"{c.event.op} receives {c.fmt.name} tensors, which it does not support on CUDA "
            "('Low precision dtypes not supported'); the scan went on with it in FP32"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title=f"Compute {c.event.op} in FP32 (autocast disabled)", region=True)
