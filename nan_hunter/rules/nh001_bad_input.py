"""NH001: the sample batch already holds NaN or inf."""

from __future__ import annotations

from typing import Any

import torch

from nan_hunter.findings import Finding, Kind, Phase, Severity
from nan_hunter.rules.registry import ScanEvidence, SiteRule, model_finding, register
from nan_hunter.trace import torch_originals
from nan_hunter.trace.stats import tensor_stats


@register
class BadInput(SiteRule):
    code = "NH001"
    name = "bad-input"
    severity = Severity.ERROR
    kind = Kind.BAD_INPUT
    summary = "The input batch contains NaN or inf before any op runs."
    doc = """\
## What
A floating-point tensor of the sample batch holds NaN or ±inf before the model runs.

## Why
Every op downstream carries the bad values, so no op can be blamed and no precision setting helps.
nan-hunter reports the tensor and the first offending indices, and stops.

## Example
```python
def sample_batch():
    x = torch.randn(4, 8)
    x[1, 3] = float("nan")   # e.g. a division by a zero std during normalisation
    return x
```

## Fix
Clean the data: check the preprocessing that produced these indices
(`torch.nan_to_num`, a guarded normalisation, or drop the samples). No automatic fix.
"""

    stage = "inputs"

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        """One finding per batch tensor that already holds NaN or inf."""
        batch = scan.batch
        named = [(f"args[{i}]", x) for i, x in enumerate(batch.args)]
        named += [(f"kwargs[{k!r}]", x) for k, x in batch.kwargs.items()]
        findings = []
        for name, value in _named_tensors(named):
            if not (value.is_floating_point() or value.is_complex()) or value.numel() == 0:
                continue
            bad = ~torch_originals.isfinite(value)
            if not bool(bad.any()):
                continue
            real = torch.view_as_real(value) if value.is_complex() else value
            stats = tensor_stats(real, scan.fmt)
            indices = [[int(i) for i in row] for row in torch.nonzero(bad)[:5].tolist()]
            findings.append(
                model_finding(
                    self,
                    phase=Phase.FORWARD,
                    origin=True,
                    message=self.describe(name, stats.nan, stats.posinf + stats.neginf, indices),
                    fix_title="Clean the input data (preprocessing, nan_to_num)",
                    inputs=(stats,),
                )
            )
        return findings

    def describe(self, name: str, nan: int, inf: int, indices: list[list[int]]) -> str:
        shown = ", ".join(str(i) for i in indices)
        more = "" if len(indices) >= nan + inf else ", ..."
        return (
            f"input {name} contains {nan} NaN and {inf} inf values before any op runs "
            f"(at {shown}{more}); nothing downstream is blamed on an op"
        )


def _named_tensors(named: list[tuple[str, Any]]) -> list[tuple[str, torch.Tensor]]:
    out: list[tuple[str, torch.Tensor]] = []
    for name, value in named:
        if isinstance(value, torch.Tensor):
            out.append((name, value))
        elif isinstance(value, (list, tuple)):
            out.extend(_named_tensors([(f"{name}[{i}]", v) for i, v in enumerate(value)]))
        elif isinstance(value, dict):
            out.extend(_named_tensors([(f"{name}[{k!r}]", v) for k, v in value.items()]))
    return out
