"""NH604 (warning): optimizer updates lost to rounding in low-precision weights, measured on the
optimizer steps of ``--steps`` (``nan-hunter run`` warns about the same as it trains)."""

from __future__ import annotations

from nan_hunter.engine.candidate import Candidate, ScanEvidence
from nan_hunter.findings import Finding, Kind, Phase, Severity
from nan_hunter.precision.lost_updates import FIX, LOST_SHARE
from nan_hunter.rules.registry import SiteRule, model_finding, register


@register
class LostUpdates(SiteRule):
    code = "NH604"
    name = "lost-low-precision-updates"
    severity = Severity.WARNING
    kind = Kind.PRECISION
    summary = (
        f"A --steps update left {LOST_SHARE:.0%}+ of the BF16/FP16 weights unchanged: w - lr * g "
        "rounds back to w."
    )
    doc = f"""\
## What
With `--steps N --mode half` the model trains with its parameters in BF16/FP16 (no FP32 master
copy). Before each optimizer step the scan copies up to 65,536 evenly spaced elements of each
low-precision parameter that has a gradient, and after it counts those whose gradient was
nonzero and whose value did not move. A step that left {LOST_SHARE:.0%} or more of them
unchanged is reported once (the first such step), with the share, the count and the dtype, and
with what FP32 master weights do with the same step: a fresh copy with FP32 parameters, trained
under autocast with the same Adam up to that step, measured the same way. An FP32 model, or
autocast with FP32 parameters, is never flagged: its update has 24 bits.

## Why
`w - lr * g` rounds back to `w` whenever `|lr * g|` is below half a unit in the last place of
`w`: at BF16's 8 bits a weight of 1.0 ignores any step below 2**-9. Training stalls with no
NaN, and the loss plateaus above the FP32 run's.

## Example
```python
model = model.to(torch.bfloat16)          # parameters in BF16
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
```

## Fix
FP32 master weights: keep the parameters in FP32 and train under `torch.autocast` (`--mode
autocast`), or an optimizer that rounds stochastically or keeps a Kahan compensation for
low-precision weights. Display-only advice: the change is to how the model is trained, not to
a line of the model.
"""

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        lost = scan.lost_updates
        if lost is None or lost.share < LOST_SHARE:
            return []
        return [model_finding(
            self, phase=Phase.BACKWARD,
            message=f"optimizer step {lost.step} of --steps: {lost.line()}; {FIX}",
            fix_title=FIX[0].upper() + FIX[1:],
        )]

    def message(self, c: Candidate) -> str:
        return "updates lost to rounding in low-precision weights"
