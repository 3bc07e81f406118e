"""NH601 (warning): integers beyond the format's exact range (256 in BF16, 2048 in FP16) held in
low precision: positions, step counts, cumulative counts."""

from __future__ import annotations

from nan_hunter.engine.candidate import Candidate, ScanEvidence
from nan_hunter.engine.precision_loss import OpPrecision
from nan_hunter.findings import Finding, Kind, Severity
from nan_hunter.rules._precision import findings, first_jump_after, integer_roots, percent, where
from nan_hunter.rules.registry import FixPlan, SiteRule, register
from nan_hunter.trace.stats import format_number

FIX = (
    "Keep the integers in FP32: `torch.arange(n, dtype=torch.float32)`, and compute what uses "
    "them (a rotary `positions * inv_freq`) under `torch.autocast(..., enabled=False)`"
)


@register
class IntegersPastExactRange(SiteRule):
    code = "NH601"
    name = "integers-past-exact-range"
    severity = Severity.WARNING
    kind = Kind.PRECISION
    summary = (
        "Integers past the format's exact range (256 in BF16, 2048 in FP16) held in it: "
        "positions, counts."
    )
    doc = """\
## What
An op puts integer values (positions, step counts, cumulative counts) larger than the format
holds exactly into BF16 or FP16: BF16 has 8 significant bits, so above 256 only every second
integer exists (above 512 every fourth); FP16 has 11, exact up to 2048. Found by the precision
check (`--precision-check on`, the default with `--dtype bfloat16`): the FP32 run's values at
that op are integers past the range and the low-precision ones are not all equal to them, or
an FP32 operand of integers past the range is cast down by autocast for the op (a matmul).

## Why
Position 1001 becomes 1000: two tokens share a position, and a rotary angle
`position * inv_freq` is off by whole radians, so `cos`/`sin` of it are noise. The report names
the first op downstream whose error then jumps.

## Example
```python
pos = torch.arange(seq_len, dtype=x.dtype)                 # bfloat16: 1001 -> 1000
freqs = pos[:, None] @ inv_freq[None, :]                   # under autocast: cast to bfloat16
t = torch.tensor(step, dtype=torch.half) / total_steps    # step 2049 -> 2048
```

## Fix
`dtype=torch.float32` on the `arange` (or `.to(x.dtype)` -> `.to(torch.float32)`), with the casts
to the format of the operands the positions meet before the op they ruin taken out
(`self.inv_freq.to(h.dtype)` -> `self.inv_freq`); for positions autocast casts down, the product
under `torch.autocast(device_type, enabled=False)`, as transformers' rotary embeddings do. Each
fix is verified by a re-scan with the precision check: no NH6xx left where it edits, no new one,
and the loss no further from FP32's.
"""

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        if scan.precision is None:
            return []

        def message(op: OpPrecision) -> str:
            return self._message(scan, op)

        return findings(self, integer_roots(scan.precision), message, FIX)

    def _message(self, scan: ScanEvidence, op: OpPrecision) -> str:
        fmt, largest = scan.fmt, op.reference.outputs[0].abs_max if op.reference else None
        exact = format_number(fmt.exact_integers)
        if op.integer_outputs:
            made = f"{op.event.op} makes integers up to {format_number(largest or 0)} in {fmt.name}"
        else:
            made = f"autocast casts FP32 integers to {fmt.name} for {op.event.op}"
        text = f"{made}, which holds integers exactly only up to {exact}"
        after = first_jump_after(scan, op)
        if after is not None:
            text += f"; {where(after.event)} is then off by {percent(after.error)} of its range"
        return text

    def message(self, c: Candidate) -> str:
        return f"{c.event.op} holds integers beyond {c.fmt.name}'s exact range"

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title=FIX)
