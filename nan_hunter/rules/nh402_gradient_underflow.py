"""NH402 (warning): gradients lost to FP16 underflow without (enough) loss scaling."""

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
A configurable share (default 25%) of a module's nonzero gradient values, as computed in FP32,
become 0 or subnormal (below 6.1e-5) when rounded to FP16 during backward. The report gives the
share per module, and the range of loss scales for which no gradient overflows and underflow
stays under the threshold.

## Why
Gradients of deep networks are small: 1e-6 .. 1e-9 are common. FP16 cannot hold values below
6e-8 at all, so without loss scaling those updates are silently zero and the layer stops learning,
with no NaN to tell you.

## Example
```python
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x).loss
loss.backward()                               # no GradScaler: tiny gradients flush to 0
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
