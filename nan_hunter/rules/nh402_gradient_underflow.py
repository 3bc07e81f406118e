"""NH402 (warning): gradients lost to FP16 underflow at the loss scale used."""

from __future__ import annotations

from nan_hunter.findings import Kind, Severity
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register


@register
class GradientUnderflow(Rule):
    code = "NH402"
    name = "gradient-underflow"
    severity = Severity.WARNING
    kind = Kind.UNDERFLOW
    summary = "Many gradient values vanish or go subnormal in FP16: use GradScaler."
    doc = """\
## What
A configurable share (default 25%) of nonzero gradient values, as computed in FP32, become 0 or
subnormal (below 6.1e-5) when rounded to FP16 during backward, at the loss scale the scan models
(GradScaler's default 2**16 unless `--grad-scale` says otherwise). Measured where it happens:
at a module's parameter gradients, and at a dtype-cast boundary, where a gradient computed in
FP32 (a loss autocast runs in FP32) is cast down to the FP16 output that fed it, before any
parameter gradient exists. Modules at the same source line (the layers of a stack) are one
finding whose `modules` lists them. The report gives the range of loss scales for which no
gradient overflows and underflow stays under the threshold.

## Why
Gradients of deep networks are small: 1e-6 .. 1e-9 are common. FP16 cannot hold values below
6e-8 at all, so without loss scaling those updates are silently zero and the layer stops learning,
with no NaN to tell you.

## Example
```python
with torch.autocast("cuda", dtype=torch.float16):
    decoded = decoder(z)                      # FP16
    loss = 1e-6 * F.mse_loss(decoded, x)      # FP32; its gradient, ~1e-10, is cast to FP16
scaler.scale(loss).backward()                 # even at 2**16 it is subnormal: mostly lost
```

## Fix
Scale the loss with `torch.amp.GradScaler(init_scale=2**k)`, `k` as recommended in the report
(the top of the safe window, with one doubling of headroom), and step through the scaler. If no
scale fits, keep the offending layers in FP32 or train in BF16. Display-only advice.
"""

    def matches(self, c: Candidate) -> bool:
        return False  # built directly by the gradient analysis

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title="Use torch.amp.GradScaler with the recommended init_scale")
