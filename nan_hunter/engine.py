"""The scan: passes, analysis, classification and fixes, from a loaded target to a ``Report``."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch

from nan_hunter.analysis import analyse, backward_origins, cast_inputs, failures, forward_origins
from nan_hunter.batch import Batch
from nan_hunter.config import Settings
from nan_hunter.findings import (
    Applicability,
    Finding,
    Fix,
    Fp32Rerun,
    Kind,
    LossScaling,
    OpRef,
    Phase,
    Report,
    ScanTarget,
    Severity,
    SourceLocation,
    scale_text,
)
from nan_hunter.fixes.build import build_fix
from nan_hunter.loader import Target
from nan_hunter.options import explicitly_set
from nan_hunter.precision.context import PrecisionPlan, fp32_context
from nan_hunter.precision.formats import BF16, FP16, FloatFormat, format_for
from nan_hunter.precision.gradients import GradientLog, ScaleWindow
from nan_hunter.progress import announce
from nan_hunter.project import is_installed
from nan_hunter.report import render as _render  # noqa: F401  (Report.render goes through it)
from nan_hunter.rules.nh001_bad_input import BadInput
from nan_hunter.rules.nh402_gradient_underflow import gradient_underflow
from nan_hunter.rules.nh502_underflow_share import subnormal_share
from nan_hunter.rules.registry import Candidate, advice_finding, classify, get_rule
from nan_hunter.runner import PassResult, run_pass
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import TensorStats, format_number, tensor_stats


def scan_target(target: Target, settings: Settings) -> Report:
    started = time.perf_counter()
    fmt = format_for(settings.dtype)
    device = settings.resolved_device()
    info = ScanTarget(
        file=str(target.file),
        mode=settings.mode,
        dtype=settings.dtype,
        device=device,
        policy=settings.policy,
        notes=target.unwrapped,
    )
    model = target.model.to(device)
    batch = _batch_on(target.batch, device)

    bad = [f for f in check_batch(batch, fmt) if settings.rule_enabled(f.code)]
    if bad:
        return Report(info, tuple(bad), 0, 0, 0, time.perf_counter() - started)

    plan = PrecisionPlan(
        mode=settings.mode,
        policy=settings.policy,
        device=device,
        fmt=fmt,
        emulate=device == "cpu" and fmt.dtype == torch.float16 and settings.numerics == "emulated",
    )
    if (settings.mode == "half" or fmt is BF16) and not explicitly_set(settings, "grad_scale"):
        # GradScaler cannot unscale FP16 gradients (a model.half() run trains unscaled), and
        # BF16 has FP32's range: nobody runs a GradScaler with it
        settings = dataclasses.replace(settings, grad_scale=None)
    backward = _Backward(target, settings, plan, model, batch)
    scale = settings.loss_scale()
    low, log = backward.run(scale)
    window = backward.window(low, log, scale)
    skipped = 0
    if settings.dynamic_scale and backward_origins(low) and not forward_origins(low):
        settled, skipped = back_off(scale, window, fmt, low.loss)
        if settled != scale:  # analyse the step GradScaler lets through
            scale = settled
            why = f"backward at GradScaler's backed-off {scale_text(scale)}"
            low, log = backward.run(scale, why)
        if backward_origins(low) and scale > 1.0:  # overflows wherever GradScaler can go
            skipped += round(math.log2(scale))
            scale = 1.0
            low, log = backward.run(scale, "unscaled backward: overflows at every scale")
    if low.backward_ran:
        info = dataclasses.replace(info, loss_scaling=_scaling(settings, scale, skipped))
    ref: PassResult | None = None
    if forward_origins(low) or backward_origins(low) or failures(low):
        announce("FP32 reference pass")
        ref = run_pass(
            model,
            _fresh(batch),
            target.loss_fn,
            fp32_context(device),
            fmt,
            backward=bool(backward_origins(low)),
            grad_scale=scale,
            count_all=True,
        )
    analysis = analyse(
        low, ref, fmt, upstream_depth=settings.upstream_depth, window=window, grad_scale=scale
    )
    errors = [
        _finding(c, settings, plan.patch_device)
        for c in (*analysis.failures, *analysis.forward, *analysis.backward)
    ]
    errors = [f for f in errors if f is not None]
    warnings = _warnings(low, fmt, settings) + gradient_underflow(
        low, log, window, settings, fmt, scale
    )
    findings = sorted(errors, key=_order) + warnings[: settings.max_warnings]
    return Report(
        target=info,
        findings=tuple(findings),
        ops=len(low.events),
        backward_nodes=len(low.grad_events),
        propagated=analysis.propagated,
        seconds=time.perf_counter() - started,
        warnings_total=len(warnings),
        loss=low.loss,
        loss_scale=window,
        reference_loss=ref.loss if ref is not None else None,
    )


class _Backward:
    """The low-precision pass at a loss scale, and the loss-scale window measured from it."""

    def __init__(
        self,
        target: Target,
        settings: Settings,
        plan: PrecisionPlan,
        model: torch.nn.Module,
        batch: Batch,
    ) -> None:
        self.target, self.settings, self.plan = target, settings, plan
        self.model, self.batch = model, batch

    def run(self, scale: float, why: str = "") -> tuple[PassResult, GradientLog | None]:
        """One low-precision pass at loss ``scale``; ``why`` names a repeated one."""
        log = GradientLog(self.plan.fmt) if self.plan.emulate and self.settings.backward else None
        settings = self.settings
        backward = " + backward" if settings.backward else ""
        announce(why or f"{settings.dtype} {settings.mode} pass{backward}")
        low = run_pass(
            self.model,
            _fresh(self.batch),
            self.target.loss_fn,
            self.plan.low_precision(),
            self.plan.fmt,
            backward=self.settings.backward,
            numerics=self.plan.numerics(log),
            half=self.settings.mode == "half",
            grad_scale=scale,
            gradients=log,
        )
        return low, log

    def window(
        self, low: PassResult, log: GradientLog | None, scale: float
    ) -> ScaleWindow | None:
        """The loss-scale window. Gradients are only measured where they are finite, so when
        the chosen scale made them overflow, they are measured again in an unscaled backward;
        when a cast boundary (the FP32 -> FP16 cast of a loss's input) loses the gradient before
        any parameter sees it, they are measured again at the scale that keeps it, since the
        parameter gradients behind a flushed boundary say nothing."""
        if log is None or not low.backward_ran or forward_origins(low):
            return None  # gradients after a broken forward say nothing about loss scales
        share = self.settings.grad_underflow_share
        if scale != 1.0 and backward_origins(low):
            scale = 1.0
            low, log = self.run(scale, "unscaled backward for the loss-scale window")
        needed = log.boundary_low(scale, share)
        if needed is not None and 2.0**needed > scale:
            why = f"backward at {scale_text(2.0**needed)}, the scale a cast boundary needs"
            better, better_log = self.run(2.0**needed, why)
            if not backward_origins(better) and better_log is not None:
                low, log, scale = better, better_log, 2.0**needed
        records = [*low.param_grads.values(), *(b.record for b in log.boundaries)]
        return log.window(scale, share, records)


def back_off(
    scale: float, window: ScaleWindow | None, fmt: FloatFormat, loss: TensorStats | None = None
) -> tuple[float, int]:
    """GradScaler's dynamic policy on a step whose gradients overflow at ``scale``: it skips
    the step and halves the scale (``backoff_factor`` 0.5) until the gradients fit in ``fmt``.
    Returns the scale it settles at and the steps skipped on the way. The true largest gradient
    comes from the unscaled measurement in ``window`` (and a loss computed in ``fmt`` is scaled
    in ``fmt`` too); without a window, no scaling."""
    if window is None or window.max_abs == 0.0:
        return 1.0, max(0, round(math.log2(scale))) if scale > 1 else 0
    largest = window.max_abs / window.current
    if loss is not None and loss.dtype == fmt.name and loss.abs_max is not None:
        largest = max(largest, loss.abs_max)
    skipped = 0
    while scale > 1.0 and largest * scale > fmt.max:
        scale /= 2.0
        skipped += 1
    return scale, skipped


def _scaling(settings: Settings, scale: float, skipped: int) -> LossScaling:
    if settings.grad_scale is None:
        return LossScaling("none", 1.0, 1.0)
    if settings.dynamic_scale:
        return LossScaling("dynamic", settings.loss_scale(), scale, skipped)
    return LossScaling("fixed", scale, scale)


def _order(f: Finding) -> tuple[int, int]:
    return (0 if f.phase is Phase.FORWARD else 1, f.op_index or 0)


def _fresh(batch: Batch) -> Batch:
    """A copy of the batch for one pass: a model that writes into its inputs must not change
    the next pass's inputs, nor the caller's batch."""

    return batch.map(torch.Tensor.clone)


def _batch_on(batch: Batch, device: str) -> Batch:
    return batch.map(lambda x: x.to(device))


def check_batch(batch: Batch, fmt: FloatFormat) -> list[Finding]:
    """One NH001 finding per batch tensor that already holds NaN or inf."""
    rule = BadInput()
    named = [(f"args[{i}]", x) for i, x in enumerate(batch.args)]
    named += [(f"kwargs[{k!r}]", x) for k, x in batch.kwargs.items()]
    findings = []
    for name, value in _named_tensors(named):
        if not (value.is_floating_point() or value.is_complex()) or value.numel() == 0:
            continue
        bad = ~torch.isfinite(value)
        if not bool(bad.any()):
            continue
        stats = tensor_stats(torch.view_as_real(value) if value.is_complex() else value, fmt)
        indices = [[int(i) for i in row] for row in torch.nonzero(bad)[:5].tolist()]
        findings.append(
            Finding(
                code=rule.code,
                severity=rule.severity,
                kind=rule.kind,
                phase=Phase.FORWARD,
                op="",
                module="",
                location=None,
                origin=True,
                message=rule.describe(name, stats.nan, stats.posinf + stats.neginf, indices),
                fix=Fix(
                    title="Clean the input data (preprocessing, nan_to_num)",
                    applicability=Applicability.DISPLAY_ONLY,
                    diff=None,
                ),
                inputs=(stats,),
            )
        )
    return findings


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


def _finding(c: Candidate, settings: Settings, device: str) -> Finding | None:
    rule = classify(c)
    if not settings.rule_enabled(rule.code):
        return None
    event = c.event
    fp32 = None
    if c.ref_finite is not None:
        fp32 = Fp32Rerun(finite=c.ref_finite, abs_max=c.ref_abs_max,
                         own_inputs_finite=c.own_inputs_finite)
    upstream = None
    if c.upstream is not None:
        up = c.upstream.event
        upstream = OpRef(op=up.op, module=up.module, location=up.location, reason=c.upstream.reason)
    plan = rule.fix(c)
    site = _edit_site(event)
    half_dtype = f"torch.{settings.dtype}" if settings.mode == "half" else None
    fix = (
        build_fix(c, plan, device=device, site=site, half_dtype=half_dtype)
        if plan is not None else None
    )
    severity, notes = rule.severity, _bf16_alternative(c, rule.kind_for(c))
    if c.contained:
        severity = Severity.INFO
        notes = (
            "contained: these non-finite values only reach integer or boolean results "
            "(indices, masks); no floating value downstream depends on them",
        )
    return Finding(
        code=rule.code,
        severity=severity,
        kind=rule.kind_for(c),
        phase=c.phase,
        op=event.op,
        module=event.module,
        location=event.location,
        origin=True,
        message=rule.message(c),
        fp32_rerun=fp32,
        fix=fix,
        inputs=event.inputs if c.grad is None else c.grad.incoming,
        outputs=event.outputs if c.grad is None else c.grad.produced,
        upstream=upstream,
        op_index=event.index,
        notes=notes,
        call_site=site if site is not event.location else None,
    )


def _edit_site(event: OpEvent) -> SourceLocation | None:
    """Where a fix for ``event`` goes: its own line when that is in the user's code, else
    the nearest call site in the user's project (the op ran in an installed library)."""
    if event.location is None:
        return None
    if event.in_user_code and not is_installed(event.location.file):
        return event.location
    return event.call_site


def _bf16_alternative(c: Candidate, kind: Kind) -> tuple[str, ...]:
    """"BF16 would avoid this" when an FP16 culprit's FP32 values fit BF16's range."""
    if c.fmt is not FP16 or c.ref_finite is not True:
        return ()
    largest = max(
        [c.ref_abs_max or 0.0] + [c.event.inputs[i].abs_max or 0.0 for i in c.cast_inputs]
    )
    if kind is Kind.OVERFLOW and 0.0 < largest < BF16.max:
        reach = format_number(largest)
        return (
            f"BF16 would avoid this: its range reaches {format_number(BF16.max)} and this op's "
            f"FP32 values reach {reach}; use torch.autocast(..., dtype=torch.bfloat16)",
        )
    if kind is Kind.UNDERFLOW:
        return (
            "BF16 would avoid this: its smallest normal is "
            f"{format_number(BF16.smallest_normal)}, so small values and eps constants survive; "
            "use torch.autocast(..., dtype=torch.bfloat16)",
        )
    return ()


def _warnings(low: PassResult, fmt: FloatFormat, settings: Settings) -> list[Finding]:
    """NH501 (FP32 results beyond range, not cast) and NH502 (subnormal share), one per site."""
    cast_producers = _cast_chains(low, fmt)
    found: list[Finding] = []
    seen: set[tuple[str, str, str, int]] = set()
    for event in low.events:
        if not event.inputs_finite or not event.outputs_finite:
            continue
        code = None
        if (
            event.index in low.escaped
            and event.index not in cast_producers
            and _out_of_range_at_risk(event, fmt)
        ):
            code = "NH501"
        elif _underflows(event, fmt, settings):
            code = "NH502"
        if code is None or not settings.rule_enabled(code):
            continue
        site = (code, event.op, event.location.file if event.location else "",
                event.location.line if event.location else 0)
        if site in seen:
            continue
        seen.add(site)
        rule = get_rule(code)
        assert rule is not None
        c = Candidate(phase=Phase.FORWARD, event=event, fmt=fmt)
        plan = rule.fix(c)
        found.append(
            advice_finding(
                rule,
                event,
                phase=Phase.FORWARD,
                message=rule.message(c),
                fix_title=plan.title if plan else None,
            )
        )
    return found


def _cast_chains(low: PassResult, fmt: FloatFormat) -> set[int]:
    """Ops whose out-of-range output reaches an NH101 cast, directly or through ops that pass
    the value on (ReLU, an eval-mode Dropout): NH101 already blames them, no NH501 too."""
    found: set[int] = set()
    stack = [
        e.producers[i]
        for e in forward_origins(low)
        for i in cast_inputs(e, fmt)
        if e.producers[i] is not None
    ]
    while stack:
        index = stack.pop()
        if index is None or index in found:
            continue
        event = low.events[index]
        if not any(s.exceeds(fmt.max) for s in event.outputs):
            continue
        found.add(index)
        stack.extend(
            p for p, s in zip(event.producers, event.inputs, strict=False) if s.exceeds(fmt.max)
        )
    return found


def _out_of_range_at_risk(event: OpEvent, fmt: FloatFormat) -> bool:
    """An FP32 result beyond ``fmt``'s range, made by this op (not passed through from an
    input), where autocast is on and could cast it down. Loss ops and FP32 regions the user
    opened with ``autocast(enabled=False)`` are not at risk; the caller also requires that the
    value leaves its module, so that a later layer may cast it (values that FP32 ops consume
    inside the module, as ``x.pow(2).mean()`` in a norm, are not at risk)."""
    if event.in_loss or not event.autocast:
        return False
    largest_in = max((s.abs_max or 0.0 for s in event.inputs), default=0.0)
    return any(
        s.dtype == "float32" and s.exceeds(fmt.max) and (s.abs_max or 0.0) > largest_in
        for s in event.outputs
    )


def _underflows(event: OpEvent, fmt: FloatFormat, settings: Settings) -> bool:
    if not any(s.dtype == fmt.name for s in event.outputs):
        return False
    tiny = sum(s.tiny or 0 for s in event.outputs)
    if tiny < settings.underflow_min_count:
        return False
    c = Candidate(phase=Phase.FORWARD, event=event, fmt=fmt)
    return subnormal_share(c) >= settings.underflow_share

