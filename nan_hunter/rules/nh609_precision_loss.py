"""NH609 (warning): an op whose error against FP32 jumps far beyond what one rounding of the
format explains, not a subtraction (NH602) and not after integers past the exact range (NH601)."""

from __future__ import annotations

from nan_hunter.engine.candidate import Candidate, ScanEvidence
from nan_hunter.engine.precision_loss import OpPrecision
from nan_hunter.findings import Finding, Kind, Severity
from nan_hunter.rules._precision import findings, jumps, percent
from nan_hunter.rules.registry import FixPlan, SiteRule, register

FIX = "Compute this op and its operands in FP32 (`torch.autocast(..., enabled=False)`, `.float()`)"


@register
class PrecisionLoss(SiteRule):
    code = "NH609"
    name = "precision-loss"
    severity = Severity.WARNING
    kind = Kind.PRECISION
    summary = (
        "An op loses far more precision than one rounding explains, against FP32: an origin "
        "of precision loss."
    )
    doc = """\
## What
The precision check (`--precision-check on`, the default with `--dtype bfloat16`) runs the
model again in FP32, with the same dropout masks, and compares each op's result with the
same op's (matched by op, line and occurrence): `error = max |low - fp32| / max |fp32|`. An op
whose error exceeds `precision_jump` (default 16) times its inputs' error (the largest error of
the ops that made them) plus one rounding of the format (2**-8 BF16, 2**-11 FP16) is where
precision is lost. NH602 reports subtractions, NH601 what integers past the exact range ruin,
NH603 long accumulations; NH609 the rest: the first op only, the ops after it inherit its error.

## Why
BF16 has FP32's range, so a BF16 run rarely overflows: it loses precision instead, and the
loss and gradients drift from FP32's without a NaN. An op that is sensitive to its inputs'
small errors (`exp` of large values, `cos` of large angles, a division by a small difference)
amplifies the rounding of the format. The report's header says how far the loss and the
gradients end up (`precision vs FP32`).

## Example
```python
w = torch.exp(scores)               # scores ~ 40 in bfloat16: 0.3 absolute error -> 30%
```

## Fix
`log(1 + x)` -> `torch.log1p(x)` where that is the expression; else this op and the elementwise
ops that rounded its inputs in FP32, upcast where they leave the last matmul or module
(`80 + self.fc(x).float()`), the op alone or its statement in an FP32 region. Verified by a
re-scan with the precision check; a better conditioned formulation (`softmax`, `logsumexp`) is
the hand-written alternative.
"""

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        _, other = jumps(scan)
        return findings(self, other, lambda op: self._message(scan, op), FIX)

    def _message(self, scan: ScanEvidence, op: OpPrecision) -> str:
        return (
            f"{op.event.op} is off from FP32 by {percent(op.error)} of its range, its inputs by "
            f"{percent(op.input_error)}: more than {scan.settings.precision_jump:g} times what "
            f"{scan.fmt.name}'s rounding ({percent(scan.fmt.unit_roundoff)}) explains"
        )

    def message(self, c: Candidate) -> str:
        return f"{c.event.op} loses precision in {c.fmt.name}"

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title=FIX)
