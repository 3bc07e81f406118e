"""NH004: the forward asked which device it runs on, so a CUDA run may take another path."""

from __future__ import annotations

from nan_hunter.findings import Applicability, Finding, Fix, Kind, Phase, Severity
from nan_hunter.rules.registry import ScanEvidence, SiteRule, register


@register
class DeviceDependentPath(SiteRule):
    code = "NH004"
    name = "device-dependent-path"
    severity = Severity.ERROR
    kind = Kind.NOT_CHECKED
    summary = "The forward branches on its device: the path a CUDA run takes was not checked."
    doc = """\
## What
The scan predicts a CUDA run on a machine without one: it runs the forward on the CPU under
CUDA's autocast policy. This forward asked which device it runs on (`x.is_cuda`, `x.is_cpu`,
`x.get_device()`, `x.device.type`, `torch.cuda.is_available()`) and got the CPU's answer.

## Why
Code that asks usually chooses by the answer: an early return for the CPU, an autocast
wrapper `enabled=x.is_cuda` that keeps CPU runs in FP32, a fused kernel on CUDA only. The scan
checked the path the CPU takes; the ops a CUDA run takes instead were not run, so nothing
checked them, and a report without errors does not cover them.

## Example
```python
def forward(self, x):
    with torch.autocast("cuda", enabled=x.is_cuda):   # FP32 on the CPU, FP16 on CUDA
        return self.head(self.body(x))
```

A branch the scan could not follow is an error: a CI check that passes here would pass on a
model whose CUDA path was never run. (Ops the tracer did not see, NH003, are a warning: they
ran, and the loss and gradients they feed were checked.) Where the other path is known
to be safe, say so with `ignore = ["NH004"]` or a suppression comment on the line.

## Fix
Make the path the same on every device while scanning (decide by a setting, not by the
tensor's device), or scan on a CUDA machine (`--device cuda`). No automatic fix.
"""

    stage = "pass"

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        low = scan.low
        if low is None or not low.device_queries or not scan.settings.predicts_another_device():
            return []
        asked, where = low.device_queries[0]
        more = len(low.device_queries) - 1
        device = scan.settings.resolved_device()
        return [
            Finding(
                code=self.code,
                severity=self.severity,
                kind=self.kind,
                phase=Phase.FORWARD,
                op=asked.lstrip("."),
                module="",
                location=where,
                origin=False,
                message=(
                    f"the forward asked which device it runs on (`{asked}`) and got the "
                    f"{device.upper()}'s answer"
                    + (f" ({more} more such lines)" if more else "")
                    + f": a {scan.settings.policy.upper()} run may take a path this scan did "
                    "not run, and its ops were not checked"
                ),
                fix=Fix(
                    title="Take the same path on every device while scanning, or scan on "
                    f"{scan.settings.policy.upper()} (--device {scan.settings.policy})",
                    applicability=Applicability.DISPLAY_ONLY,
                ),
            )
        ]
