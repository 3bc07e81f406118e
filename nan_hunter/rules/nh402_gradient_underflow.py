"""NH402 (warning): gradients lost to FP16 underflow at the loss scale used, detected from the
emulated backward.

Two places lose FP16 gradients: a module's own parameter gradients (rounded in FP16), and a cast
boundary, where a gradient computed in FP32 (a loss autocast runs in FP32) is cast down to the
FP16 output that fed it, before any parameter gradient exists. Warnings with the same cause at
the same source line (every layer of a stack built by one loop) are one finding listing the
modules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nan_hunter.engine.runner import PassResult
from nan_hunter.findings import Finding, Kind, Phase, Severity, scale_text
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.gradients import FlushStats, GradientLog, ScaleWindow, scale_advice
from nan_hunter.project.config import Settings
from nan_hunter.rules.registry import (
    Candidate,
    FixPlan,
    Rule,
    ScanEvidence,
    SiteRule,
    advice_finding,
    register,
)
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import format_number


@register
class GradientUnderflow(SiteRule):
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

    def detect(self, scan: ScanEvidence) -> list[Finding]:
        assert scan.low is not None
        return gradient_underflow(
            scan.low, scan.log, scan.window, scan.settings, scan.fmt, scan.scale
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title="Use torch.amp.GradScaler with the recommended init_scale")


MIN_VALUES = 16
"""Modules (and cast boundaries) with fewer nonzero gradient values than this are not judged."""
LISTED_MODULES = 4
"""A grouped finding's message names this many modules (``modules`` holds them all)."""


@dataclass(frozen=True)
class _Loss:
    """Gradient values lost at one module's parameters."""

    module: str
    names: tuple[str, ...]
    stats: FlushStats
    event: OpEvent


def gradient_underflow(
    low: PassResult,
    log: GradientLog | None,
    window: ScaleWindow | None,
    settings: Settings,
    fmt: FloatFormat,
    scale: float,
) -> list[Finding]:
    """NH402 warnings: cast boundaries that lose the gradient first, then one per source line
    whose modules' parameter gradients lose too much in FP16 at loss scale ``scale``."""
    rule = GradientUnderflow()
    if not settings.rule_enabled(rule.code):
        return []
    at = "without loss scaling" if scale == 1.0 else f"at loss scale {scale_text(scale)}"
    advice = f"; {scale_advice(window, fmt)}" if window is not None else ""
    title = "Use torch.amp.GradScaler"
    if window is not None and window.recommended is not None:
        title = f"Use torch.amp.GradScaler(init_scale=2**{window.recommended})"
    found = _boundaries(low, log, settings, fmt, rule, at, advice, title)
    for group in _grouped(_module_losses(low, settings)):
        found.append(_module_finding(group, fmt, rule, at, advice, title))
    return found


def _module_losses(low: PassResult, settings: Settings) -> list[_Loss]:
    by_module: dict[str, tuple[FlushStats, list[str]]] = {}
    for name, record in low.param_grads.items():
        module = name.rpartition(".")[0]
        total, names = by_module.get(module, (FlushStats(0, 0, 0), []))
        by_module[module] = (total + record.flush, [*names, name])
    first_event: dict[str, OpEvent] = {}
    for event in low.events:
        first_event.setdefault(event.module, event)
    losses = []
    for module, (stats, names) in by_module.items():
        event = first_event.get(module)
        if event is None or stats.nonzero < MIN_VALUES:
            continue
        if stats.lost_share > settings.grad_underflow_share:
            losses.append(_Loss(module, tuple(names), stats, event))
    return losses


def _grouped(losses: list[_Loss]) -> list[list[_Loss]]:
    """Losses at the same op and source line (one line of code, many layers) together."""
    groups: dict[tuple[str, str, int], list[_Loss]] = {}
    for loss in losses:
        where = loss.event.location
        key = (
            (loss.event.op, where.file, where.line)
            if where is not None
            else (loss.event.op, loss.module, 0)
        )
        groups.setdefault(key, []).append(loss)
    return list(groups.values())


def _module_finding(
    group: list[_Loss], fmt: FloatFormat, rule: Rule, at: str, advice: str, title: str
) -> Finding:
    stats = group[0].stats
    for loss in group[1:]:
        stats = stats + loss.stats
    counts = (
        f"({stats.vanished} vanish, {stats.subnormal} go subnormal, of {stats.nonzero})"
    )
    if len(group) == 1:
        whose = ", ".join(group[0].names)
    else:
        listed = ", ".join(loss.module for loss in group[:LISTED_MODULES])
        more = f" and {len(group) - LISTED_MODULES} more" if len(group) > LISTED_MODULES else ""
        whose = f"the parameters of {len(group)} modules at this line ({listed}{more})"
    message = (
        f"{format_number(stats.lost_share * 100)}% of the nonzero gradient values of {whose} "
        f"are lost in {fmt.name} {at} {counts}{advice}"
    )
    finding = advice_finding(
        rule, group[0].event, phase=Phase.BACKWARD, message=message, fix_title=title,
        module=group[0].module, stats=False,
    )
    if len(group) == 1:
        return finding
    return dataclasses.replace(finding, modules=tuple(loss.module for loss in group))


def _boundaries(
    low: PassResult,
    log: GradientLog | None,
    settings: Settings,
    fmt: FloatFormat,
    rule: Rule,
    at: str,
    advice: str,
    title: str,
) -> list[Finding]:
    """One NH402 per FP32 op whose gradient, cast down to the FP16 value that fed it, loses
    more than ``grad_underflow_share``: located at that op (a loss in ``loss_fn``, an FP32
    region), blaming the module whose FP16 output receives the remains."""
    if log is None:
        return []
    found = []
    seen: set[int] = set()
    consumers = _Consumers(low, fmt)
    for boundary in log.boundaries:
        stats = boundary.record.flush
        if stats.nonzero < MIN_VALUES or stats.lost_share <= settings.grad_underflow_share:
            continue
        event = consumers.of(boundary.shape)
        if event is None or event.index in seen:
            continue
        seen.add(event.index)
        producer = _fp16_producer(low, event, boundary.shape, fmt)
        into = f" into the {fmt.name} output of '{producer.module}'" if producer and (
            producer.module
        ) else ""
        message = (
            f"{format_number(stats.lost_share * 100)}% of the nonzero gradient values flowing "
            f"back from {event.op}{into} are lost at the FP32 -> {fmt.name} cast {at} "
            f"({stats.vanished} vanish, {stats.subnormal} go subnormal, of {stats.nonzero}): "
            f"every parameter gradient behind it is computed from what is left{advice}"
        )
        module = producer.module if producer is not None else event.module
        finding = advice_finding(
            rule, event, phase=Phase.BACKWARD, message=message, fix_title=title, stats=False,
        )
        # the consumer may be the scan's own loss (``run``'s re-run: no line of the user's):
        # the line that produced the FP16 output then
        where = finding.location or (producer.location if producer is not None else None)
        found.append(dataclasses.replace(finding, modules=(module,) if module else (),
                                         location=where))
    return found


class _Consumers:
    """The ops that received an FP16 tensor and computed in FP32, by the received shape: the
    loss's first (ops in ``loss_fn``), else the forward's last. Indexed once per pass, so a model
    with many boundaries does not scan its events once per boundary."""

    def __init__(self, low: PassResult, fmt: FloatFormat) -> None:
        self._in_loss: dict[tuple[int, ...], OpEvent] = {}
        self._last: dict[tuple[int, ...], OpEvent] = {}
        for event in low.events:
            if not any(s.dtype == "float32" for s in event.outputs):
                continue
            for shape in {tuple(s.shape) for s in event.inputs if s.dtype == fmt.name}:
                self._last[shape] = event
                if event.in_loss:
                    self._in_loss.setdefault(shape, event)

    def of(self, shape: tuple[int, ...]) -> OpEvent | None:
        return self._in_loss.get(shape) or self._last.get(shape)


def _fp16_producer(
    low: PassResult, event: OpEvent, shape: tuple[int, ...], fmt: FloatFormat
) -> OpEvent | None:
    for stats, producer in zip(event.inputs, event.producers, strict=False):
        if producer is not None and stats.dtype == fmt.name and tuple(stats.shape) == shape:
            return low.events[producer]
    return None
