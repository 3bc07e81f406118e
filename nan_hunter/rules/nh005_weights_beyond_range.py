"""NH005: under ``model.half()``, a parameter or buffer that FP32 holds is ±inf in FP16."""

from __future__ import annotations

import inspect
import linecache
import re

import torch

from nan_hunter.core.location import SourceLocation
from nan_hunter.findings import Applicability, Finding, Fix, Kind, Phase, Severity
from nan_hunter.precision.formats import LOW_PRECISION_DTYPES, FloatFormat
from nan_hunter.project.paths import is_installed
from nan_hunter.rules.registry import ScanEvidence, SiteRule, register
from nan_hunter.trace import torch_originals as real
from nan_hunter.trace.stats import tensor_stats


@register
class WeightsBeyondRange(SiteRule):
    code = "NH005"
    name = "weight-beyond-fp16-range"
    severity = Severity.ERROR
    kind = Kind.OVERFLOW
    summary = "A parameter or buffer is finite in FP32 and ±inf once the model is cast to FP16."
    keeps_module_in_fp32 = True
    doc = """\
## What
Under `model.half()` every floating parameter and buffer is cast to FP16. One of them holds a
value beyond FP16's range (max 65504), typically a mask constant registered as a buffer
(`register_buffer("neg", torch.tensor(-1e10))`) or a large fixed scale: after the cast it is ±inf.
No op produced the inf, so no op is to blame: every op taking the tensor only passes it on.
An error when the loss is then NaN or inf (`(1 - m) * -inf` is NaN where `m = 1`); a warning
when every op taking it stayed finite on this batch (`masked_fill(mask, -inf)` then a softmax
over a row that is not fully masked), since another batch can go the other way.

## Why
The constant was written for FP32. Autocast keeps parameters and buffers in FP32: there the op
that meets the constant in FP16 is blamed instead (NH101). A model cast as a whole has no such op.

## Example
```python
self.register_buffer("neg", torch.tensor(-1e10))   # -inf after model.half()
...
logits = logits + (1.0 - m) * self.neg             # 0 * -inf = NaN
```

## Fix
Keep the constant out of the weights: use the limit of the dtype the tensor meets,
`torch.finfo(logits.dtype).min`, where it is used, or a boolean mask with `masked_fill`
(or `F.scaled_dot_product_attention(..., attn_mask=mask)`). That edit is where the buffer is
used, which may be several places, so it is advice. The automatic fix, verified by a re-scan, keeps
the module holding the tensor in FP32 under `.half()` (an `_apply` of its class that leaves its
FP32 tensors FP32, with its inputs upcast and its results cast back), as transformers'
`_keep_in_fp32_modules` does.
"""

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        if scan.model is None or scan.settings.mode != "half" or scan.low is None:
            return []
        loss = scan.low.loss
        loss_finite = loss is None or loss.finite
        findings = []
        for module_name, module in scan.model.named_modules():
            tensors = [
                *module.named_parameters(recurse=False), *module.named_buffers(recurse=False)
            ]
            for name, tensor in tensors:
                if (f"{module_name}.{name}" if module_name else name) in scan.low.kept:
                    continue  # the module keeps itself in FP32 under the cast
                finding = self._check(module_name, module, name, tensor, scan.fmt, loss_finite)
                if finding is not None:
                    findings.append(finding)
        return findings

    def _check(
        self,
        module_name: str,
        module: torch.nn.Module,
        name: str,
        tensor: torch.Tensor,
        fmt: FloatFormat,
        loss_finite: bool,
    ) -> Finding | None:
        if not tensor.is_floating_point() or tensor.dtype in LOW_PRECISION_DTYPES:
            return None
        if tensor.numel() == 0 or tensor.is_meta:
            return None
        with torch.no_grad():
            value = tensor.detach()
            if not bool(real.isfinite(value).all()):
                return None  # an inf the user put there (a -inf mask buffer): theirs, not ours
            cast = value.to(fmt.dtype)
            beyond = ~real.isfinite(cast)
            count = int(beyond.sum())
            if count == 0:
                return None
            reach = float(value.abs().max())
        qualified = f"{module_name}.{name}" if module_name else name
        consequence = (
            "; every op taking it stayed finite on this batch, another batch can make it NaN"
            if loss_finite else ", and the loss is not finite"
        )
        message = (
            f"{qualified} ({type(module).__name__}) holds {count} value(s) up to "
            f"|x| = {reach:.2e} that {fmt.name} cannot hold: the model's cast to {fmt.name} "
            f"makes them ±inf, an inf no op made{consequence}"
        )
        return Finding(
            code=self.code,
            severity=Severity.WARNING if loss_finite else self.severity,
            kind=self.kind,
            phase=Phase.FORWARD,
            op="",
            module=module_name,
            location=_definition(module, name),
            origin=not loss_finite,
            message=message,
            fix=Fix(
                title=(
                    f"Keep {name} out of the weights: use torch.finfo(<tensor>.dtype).min (or "
                    ".max) where it is used, or a boolean mask with masked_fill"
                ),
                applicability=Applicability.DISPLAY_ONLY,
            ),
            inputs=(tensor_stats(value, fmt),),
        )


def _definition(module: torch.nn.Module, name: str) -> SourceLocation | None:
    """The line of the module's class that registers or assigns ``name``, when it has one."""
    try:
        filename = inspect.getsourcefile(type(module))
        lines, start = inspect.getsourcelines(type(module))
    except (OSError, TypeError):
        return None
    if filename is None or is_installed(filename):
        return None  # a library's class (nn.Linear's weight): no line of the user's to show
    pattern = re.compile(
        rf"""(["']){re.escape(name)}\1|self\.{re.escape(name)}\s*(:[^=]*)?=(?!=)"""
    )
    for offset, text in enumerate(lines):
        if pattern.search(text):
            line = start + offset
            return SourceLocation(file=filename, line=line,
                                  code=linecache.getline(filename, line).strip())
    return None
