"""NH002: a backward was asked for and none could be analysed."""

from __future__ import annotations

from nan_hunter.engine.traced_forward import NO_PARAMETERS
from nan_hunter.findings import Finding, Kind, Phase, Severity
from nan_hunter.rules.registry import ScanEvidence, SiteRule, model_finding, register


@register
class BackwardNotAnalysed(SiteRule):
    code = "NH002"
    name = "backward-not-analysed"
    severity = Severity.ERROR
    kind = Kind.NOT_CHECKED
    summary = "A backward was asked for, but none could run: the gradients were not checked."
    doc = """\
## What
The scan runs the model's forward and then a backward from its loss, to find the gradients that
overflow or underflow FP16. Here no backward could be analysed: no parameter requires a gradient,
the loss is detached from every parameter, or no parameter gets a gradient from it.

## Why
Half of FP16's failures are in the backward (gradient overflow, gradients flushed to zero without
loss scaling). A report without findings would say "clean" about gradients it never saw, and a CI
check built on it would pass on nothing. The scan turns gradients on for its own passes (a model
file that calls `torch.set_grad_enabled(False)` at import, an API call inside `torch.no_grad()` or
`torch.inference_mode()` is fine), so what is left is the model's or the loss's own doing.

## Example
```python
def loss_fn(output, batch):
    return output.detach().pow(2).mean()   # reaches no parameter
```

## Fix
Compute the loss from the model's output without `.detach()`/`.item()`/`torch.no_grad()`, and
keep the trained parameters' `requires_grad`. To check the forward only, say so: `--no-backward`
(the report then notes that the backward was not analysed, and is not an error).
"""

    stage = "pass"

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        low = scan.low
        if low is None or not scan.settings.backward or not low.backward_skipped:
            return []
        if low.backward_skipped == NO_PARAMETERS:  # nothing trains: noted, not a finding
            return []
        return [
            model_finding(  # no op made it: nothing to count among the origins
                self,
                phase=Phase.BACKWARD,
                message=(
                    f"the backward was not analysed: {low.backward_skipped}; no gradient was "
                    "checked, so this scan cannot say the model trains in FP16"
                ),
                fix_title="Let the loss reach the trained parameters (or scan with "
                "--no-backward to check the forward only)",
            )
        ]
