"""NH602 (warning): a subtraction of nearly equal low-precision values keeps little but their
rounding error (``1 - cos``, ``x - x.mean()``, ``E[x^2] - E[x]^2``)."""

from __future__ import annotations

from nan_hunter.engine.candidate import Candidate, ScanEvidence
from nan_hunter.engine.precision_loss import OpPrecision
from nan_hunter.findings import Finding, Kind, Severity
from nan_hunter.rules._precision import findings, jumps, percent
from nan_hunter.rules.registry import FixPlan, SiteRule, register

FIX = (
    "Compute the subtraction and its operands in FP32 (`.float()` under "
    "`torch.autocast(..., enabled=False)`), or a stable form: `torch.var`, "
    "`2 * torch.sin(x / 2) ** 2` for `1 - cos(x)`"
)


@register
class Cancellation(SiteRule):
    code = "NH602"
    name = "cancellation"
    severity = Severity.WARNING
    kind = Kind.PRECISION
    summary = (
        "A subtraction loses far more precision than its operands hold (cancellation), "
        "against FP32."
    )
    doc = """\
## What
A subtraction (`a - b`, `1 - x`, `torch.sub`) whose result, compared with the same op in an
FP32 run, is off by more than `precision_jump` (default 16) times its operands' own error plus
one rounding of the format (2**-8 in BF16, 2**-11 in FP16). Errors are relative to the largest
value: `max |low - fp32| / max |fp32|`. Found by the precision check (`--precision-check on`,
the default with `--dtype bfloat16`).

## Why
Subtracting nearly equal numbers cancels their leading bits and leaves their rounding error:
with 8 significant bits, `1 - cos(0.05)` is 0 or 0.0039 instead of 0.00125, and a variance
computed as `E[x^2] - E[x]^2` can come out negative (the report says so), so its `sqrt` is NaN.

## Example
```python
var = (x * x).mean(-1) - x.mean(-1) ** 2        # cancels when the mean is large
d = 1 - torch.cos(theta)                        # small angles
```

## Fix
A form that does not cancel where the expression is one nan-hunter knows (`1 - cos(x)` ->
`2 * torch.sin(x / 2) ** 2`, `exp(x) - 1` -> `torch.expm1(x)`); else the operands in FP32,
upcast where they leave the last matmul or module (`self.fc(x).float() + 100`, no region, no
matmul moved), or in an FP32 region. Each is verified by a re-scan with the precision check and
the least costly verified one is offered (a two-pass `torch.var` is the hand-written
alternative).
"""

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        cancel, _ = jumps(scan)
        return findings(self, cancel, lambda op: self._message(scan, op), FIX)

    def _message(self, scan: ScanEvidence, op: OpPrecision) -> str:
        text = (
            f"{op.event.op} cancels: its result is off from FP32 by {percent(op.error)} of its "
            f"range, its operands by {percent(op.input_error)} ({scan.fmt.name} rounds by "
            f"{percent(scan.fmt.unit_roundoff)})"
        )
        low = op.event.outputs[0] if op.event.outputs else None
        ref = op.reference.outputs[0] if op.reference and op.reference.outputs else None
        if low is not None and ref is not None and ref.min is not None and low.min is not None \
                and ref.min >= 0 > low.min:
            text += "; it is negative where FP32 is not (a variance below 0)"
        return text

    def message(self, c: Candidate) -> str:
        return f"{c.event.op} cancels in {c.fmt.name}"

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title=FIX)
