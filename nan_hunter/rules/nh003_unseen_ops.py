"""NH003: ops ran in the forward that the tracer did not see, so nobody checked them."""

from __future__ import annotations

from nan_hunter.findings import Finding, Kind, Phase, Severity
from nan_hunter.rules.registry import ScanEvidence, SiteRule, model_finding, register


@register
class UnseenOps(SiteRule):
    code = "NH003"
    name = "unseen-ops"
    severity = Severity.WARNING
    kind = Kind.NOT_CHECKED
    summary = "Ops ran that the tracer could not see: their values were not checked."
    doc = """\
## What
A module's output was computed (it has an autograd graph node) by no op the tracer recorded.
Something in the forward ran torch ops out of the tracer's sight: code under
`torch._C.DisableTorchFunction()`, or ops called from C++ (an extension's own kernels).

Not counted here: a view of a parameter a module returns (`self.latents.expand(b, -1, -1)`,
seen as a view of the parameter), and a forward recomputed inside the backward (reversible
layers, activation checkpointing), which repeats ops the tracer saw in the forward; the report's
"not checked" notes say so.

## Why
nan-hunter checks every op it sees for values outside FP16's range. Ops it does not see may
overflow unchecked, so the report says which modules were not checked, in this warning and in
its "not checked" notes. It is a gap in what the scan checked, not evidence that the model
breaks: it does not fail the scan unless `--fail-on warning` is asked for. A NaN or inf those
ops make still reaches the loss or a gradient, which the scan checks (NH901, NH401).

## Example
```python
def forward(self, x):
    with torch._C.DisableTorchFunction():
        return x @ self.big     # overflows FP16, unseen
```

## Fix
Let the ops run as plain Python torch calls while scanning (remove the
`DisableTorchFunction` block). No automatic fix.
"""

    stage = "pass"

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        low = scan.low
        if low is None or not low.unseen:
            return []
        modules = ", ".join(low.unseen[:5]) + (", ..." if len(low.unseen) > 5 else "")
        return [
            model_finding(
                self,
                phase=Phase.FORWARD,
                module=low.unseen[0],
                message=(
                    f"the output of {modules} was computed by ops the tracer did not see "
                    "(torch._C.DisableTorchFunction() or C++ code); their values "
                    "were not checked"
                ),
                fix_title="Run those ops as plain Python torch calls while scanning",
                modules=tuple(low.unseen),
            )
        ]
