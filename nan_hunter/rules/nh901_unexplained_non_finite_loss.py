"""NH901: the loss (or the model's output) is NaN or inf, and no error finding explains it."""

from __future__ import annotations

from pathlib import Path

from nan_hunter.engine.analysis import failures, forward_origins
from nan_hunter.findings import Applicability, Finding, Fix, Kind, Phase, Severity
from nan_hunter.rules.registry import ScanEvidence, SiteRule, register
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import TensorStats


@register
class UnexplainedNonFiniteLoss(SiteRule):
    code = "NH901"
    name = "unexplained-non-finite-loss"
    severity = Severity.ERROR
    kind = Kind.NAN
    summary = "The loss or the model's output is NaN or inf, and no op was found that made it so."
    doc = """\
## What
The low-precision pass ended with a NaN or inf loss (or a NaN or inf model output that a loss
function took in), and the analysis found no op that made it: no traced op turned finite inputs
(or a non-finite constant) into NaN or inf, and no other error explains it.

## Why
A NaN loss is never clean. nan-hunter finds origins among the ops it traces; a value made where
it does not look (ops under `torch._C.DisableTorchFunction()` in a loss function, C++ code, a
library call it does not intercept) leaves it without an op to blame. The finding says what the
trace shows and what it lacks; it does not guess a cause.

## Example
```python
def loss_fn(output, batch):
    with torch._C.DisableTorchFunction():       # untraced
        return (output - output).div(0.0).mean()  # NaN, made where nan-hunter cannot see
```

## Fix
Let the code that computes the loss run as plain Python torch calls while scanning, so that the
op that makes the NaN is traced and classified. No automatic fix.
"""

    stage = "final"

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        low = scan.low
        if low is None or any(f.is_error and f.phase is Phase.FORWARD for f in scan.errors):
            return []
        if forward_origins(low) or failures(low):
            return []  # found, and explained by its finding (one the settings ignore too)
        bad = _non_finite_end(low.loss, low.events)
        if bad is None:
            return []
        what, stats = bad
        first = _first_non_finite(low.events)
        damage = " and ".join(
            f"{count} {name}"
            for name, count in (("NaN", stats.nan), ("+inf", stats.posinf), ("-inf", stats.neginf))
            if count
        )
        return [
            Finding(
                code=self.code,
                severity=self.severity,
                kind=Kind.NAN if stats.nan else Kind.INF,
                phase=Phase.FORWARD,
                op=first.op if first is not None else "",
                module=first.module if first is not None else "",
                location=first.location if first is not None else None,
                origin=False,  # no origin was found: nothing to count among them
                message=(
                    f"{what} holds {damage} and no origin was found: {_evidence(first)}; "
                    "nan-hunter cannot say what made it"
                ),
                fix=Fix(
                    title="Run the code that makes the loss as plain Python torch calls while "
                    "scanning, so that the op that makes the NaN is traced",
                    applicability=Applicability.DISPLAY_ONLY,
                ),
                outputs=(stats,),
                op_index=first.index if first is not None else None,
            )
        ]


def _non_finite_end(
    loss: TensorStats | None, events: tuple[OpEvent, ...]
) -> tuple[str, TensorStats] | None:
    """The loss when it is non-finite, else a non-finite model output a traced loss took in."""
    if loss is not None and not loss.finite:
        return "the loss", loss
    outputs = dict.fromkeys(
        p for e in events if e.in_loss for p in e.producers
        if p is not None and not events[p].in_loss
    )
    for index in outputs:
        for stats in events[index].outputs:
            if stats.is_floating and not stats.finite:
                return "the model's output", stats
    return None


def _first_non_finite(events: tuple[OpEvent, ...]) -> OpEvent | None:
    """The first traced op that reads or makes a NaN or inf."""
    return next((e for e in events if not (e.inputs_finite and e.outputs_finite)), None)


def _evidence(first: OpEvent | None) -> str:
    """What the trace shows of the damage, and what it lacks."""
    if first is None:
        return (
            "no traced op read or made a NaN or inf, so it was made by code the tracer did not "
            "see"
        )
    where = f" ({Path(first.location.file).name}:{first.location.line})" if first.location else ""
    return (  # an origin would explain it: the value came in (a constant that was absorbed)
        f"the first non-finite value the trace shows is already an input of {first.op}{where}: "
        "no traced op made it"
    )
