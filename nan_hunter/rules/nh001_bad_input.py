"""NH001: the sample batch already holds NaN or inf."""

from __future__ import annotations

from nan_hunter.findings import Kind, Severity
from nan_hunter.rules.registry import Candidate, Rule, register


@register
class BadInput(Rule):
    code = "NH001"
    name = "bad-input"
    severity = Severity.ERROR
    kind = Kind.BAD_INPUT
    summary = "The input batch contains NaN or inf before any op runs."
    doc = """\
## What
A floating-point tensor of the sample batch holds NaN or ±inf before the model runs.

## Why
Every op downstream carries the bad values, so no op can be blamed and no precision setting helps.
nan-hunter reports the tensor and the first offending indices, and stops.

## Example
```python
def sample_batch():
    x = torch.randn(4, 8)
    x[1, 3] = float("nan")   # e.g. a division by a zero std during normalisation
    return x
```

## Fix
Clean the data: check the preprocessing that produced these indices
(`torch.nan_to_num`, a guarded normalisation, or drop the samples). No automatic fix.
"""

    def matches(self, c: Candidate) -> bool:
        return False  # built directly from the batch check, never from an op

    def describe(self, name: str, nan: int, inf: int, indices: list[list[int]]) -> str:
        shown = ", ".join(str(i) for i in indices)
        more = "" if len(indices) >= nan + inf else ", ..."
        return (
            f"input {name} contains {nan} NaN and {inf} inf values before any op runs "
            f"(at {shown}{more}); nothing downstream is blamed on an op"
        )
