"""NH302: an op CUDA autocast refuses (binary_cross_entropy / nn.BCELoss)."""

from __future__ import annotations

from nan_hunter.findings import Kind
from nan_hunter.rules.registry import Candidate, FixPlan, Rule, register


@register
class BannedOp(Rule):
    code = "NH302"
    name = "banned-under-autocast"
    priority = 5
    kind = Kind.BANNED_OP
    summary = "binary_cross_entropy / nn.BCELoss raises under CUDA autocast."
    doc = """\
## What
`torch.nn.functional.binary_cross_entropy` (and so `nn.BCELoss`) is banned under CUDA autocast:
the call raises `RuntimeError: ... unsafe to autocast`. nan-hunter reports it at your call site
and goes on with the op in FP32, so the rest of the model is still scanned. CPU autocast runs it
in FP32 instead, which is why a CPU-only test does not see it.

## Why
The loss takes probabilities; in FP16 a sigmoid output of 1 - 1e-4 rounds to 1 and
`log(1 - p)` is -inf. The fused form works on logits and is stable.

## Example
```python
probs = torch.sigmoid(self.head(h))
loss = nn.BCELoss()(probs, target)            # RuntimeError under CUDA autocast
```

## Fix
Where the sigmoid is written inside the loss call (`F.binary_cross_entropy(torch.sigmoid(z), y)`,
its only use is the loss), the patch drops it and uses `F.binary_cross_entropy_with_logits(z, y)`
/ `nn.BCEWithLogitsLoss()`, which autocast runs in FP32: safe, the classic first fix. Where the
probabilities come from elsewhere (the model's output, `sqrt(sigmoid(a) * sigmoid(b))`), the patch
runs the BCE call in an FP32 region (autocast disabled, `.float()` input), as CUDA allows: safe.
"""

    def matches(self, c: Candidate) -> bool:
        return c.event.failure is not None and c.event.failure.kind == "banned"

    def message(self, c: Candidate) -> str:
        return (
            f"{c.event.op} is banned under CUDA autocast: the call raises 'unsafe to autocast' "
            "on a GPU (the scan went on with it in FP32)"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(
            title="Remove the sigmoid and use binary_cross_entropy_with_logits / "
            "nn.BCEWithLogitsLoss on the logits",
            rewrite="bce_logits",
            fallback=FixPlan(
                title="Compute the binary cross-entropy in FP32 (autocast disabled)",
                region=True,
            ),
        )
