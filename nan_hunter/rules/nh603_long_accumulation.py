"""NH603 (warning): a sum, cumsum or product over thousands of values whose result is in low
precision."""

from __future__ import annotations

from nan_hunter.engine.candidate import Candidate, ScanEvidence
from nan_hunter.findings import Finding, Kind, Severity
from nan_hunter.project.config import Settings
from nan_hunter.rules._precision import accumulation_length, findings, long_accumulations
from nan_hunter.rules.registry import FixPlan, SiteRule, register
from nan_hunter.trace.events import OpEvent

_LENGTH = Settings().accumulation_length
FIX = "Accumulate in FP32: `torch.cumsum(x, dim, dtype=torch.float32)` (`sum`, `prod` alike)"


@register
class LongAccumulation(SiteRule):
    code = "NH603"
    name = "long-low-precision-accumulation"
    severity = Severity.WARNING
    kind = Kind.PRECISION
    summary = (
        f"A sum/cumsum/prod over {_LENGTH}+ values (accumulation_length) kept in BF16/FP16."
    )
    doc = f"""\
## What
`sum`, `nansum`, `cumsum`, `cumprod` or `prod` over at least `accumulation_length` (default
{_LENGTH}) values whose result is BF16 or FP16: called on a low-precision tensor without
`dtype=`, in `--mode half` or outside CUDA autocast (whose policy runs `sum`, `cumsum`, `prod`,
`cumprod` in FP32 unless `dtype=` is given). `mean` is left out: it keeps its inputs' magnitude
and PyTorch's kernels accumulate in FP32; NH609 reports it if it loses more than one rounding.
Needs no FP32 run.

## Why
The result grows with the count while the format keeps 8 (BF16) or 11 (FP16) significant bits:
a running sum of 4096 values near 1 has a spacing of 32 in BF16, so the differences of a
cumsum (a segment sum, a cumulative probability) are noise, and integer counts past 256/2048
are not exact (NH601).

## Example
```python
cdf = probs.cumsum(-1)                    # probs in bfloat16, 32k vocabulary
total = h.sum(dim=1)                      # model.half(), 8192 tokens
```

## Fix
`dtype=torch.float32` on the call (`torch.cumsum(x, -1, dtype=torch.float32)`), written into the
call and verified by a re-scan (no NH603 left, the loss no further from FP32's). Cast back
where the result must be low precision.
"""

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        return findings(self, long_accumulations(scan), self._message_of, FIX)

    def _message_of(self, event: OpEvent) -> str:
        dtype = event.outputs[0].dtype
        return (
            f"{event.op} accumulates {accumulation_length(event)} values into a {dtype} result "
            f"(at least {_LENGTH} warns: accumulation_length)"
        )

    def message(self, c: Candidate) -> str:
        return self._message_of(c.event)

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title=FIX)
