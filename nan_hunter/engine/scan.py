"""The scan: passes, analysis, classification and fixes, from a loaded target to a ``Report``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path

import torch

from nan_hunter.core.batch import Batch
from nan_hunter.core.progress import announce
from nan_hunter.engine.analysis import analyse, backward_origins, failures, forward_origins
from nan_hunter.engine.blame import user_errors
from nan_hunter.engine.candidate import Candidate, ScanEvidence
from nan_hunter.engine.model_state import without_inference_tensors
from nan_hunter.engine.pass_state import compared_pass_start, fewer_collections
from nan_hunter.engine.precision_loss import integer_checks, precision_evidence, precision_verdict
from nan_hunter.engine.range_map import build_range_map
from nan_hunter.engine.runner import PassResult, PassRunner, run_pass
from nan_hunter.errors import UserCodeError
from nan_hunter.findings import (
    Finding,
    LossScaling,
    Phase,
    Report,
    ScanTarget,
    scale_text,
)
from nan_hunter.fixes.build import build_fix, edit_site, with_fp16_constant, with_kept_module
from nan_hunter.fixes.kept_submodule import LibraryScope, ModelSite, library_scope
from nan_hunter.fixes.precision_fix import with_precision_fix
from nan_hunter.precision.compare import ErrorMeter, KeptOutputs
from nan_hunter.precision.context import PrecisionPlan
from nan_hunter.precision.formats import BF16, FP32, FloatFormat, format_for
from nan_hunter.precision.gradients import GradientLog, ScaleWindow
from nan_hunter.precision.heap import large_blocks_from_heap
from nan_hunter.precision.loss_scale import back_off, largest_finite
from nan_hunter.precision.lost_updates import LostUpdates
from nan_hunter.precision.replay import fp32_context
from nan_hunter.precision.work import precision_work
from nan_hunter.project.config import Settings
from nan_hunter.project.loader import Target
from nan_hunter.project.options import explicitly_set
from nan_hunter.rules.registry import classify, origin_finding, site_rules


def scan_target(
    target: Target,
    settings: Settings,
    *,
    fp32_loss: bool = False,
    lost_updates: LostUpdates | None = None,
) -> Report:
    """One scan of a loaded target. ``fp32_loss``: the report's ``reference_loss`` is measured
    even when nothing broke (one FP32 forward and loss): a verification re-scan needs the
    patched model's FP32 loss to say how much a fix changes what the model computes.
    ``lost_updates``: what ``--steps`` measured of its optimizer steps (NH604)."""
    # The passes and the analysis after them create objects that all live to the end of the
    # scan: the collector runs less often meanwhile (19% of an op-heavy scan's time otherwise).
    # The random state is the caller's: a scan draws dropout masks, and leaves it as it was.
    # Every pass whose loss is compared (low precision, FP32 reference, FP32 loss, and the
    # same passes of each verification re-scan) starts from one seed: the same masks.
    # Autograd's anomaly detection (often on while a user hunts a NaN) would raise on the very
    # NaN gradients the scan analyses: off during the passes, the user's setting restored after.
    # Blocks of 32 MiB and more come from the heap meanwhile, reused instead of mapped and
    # faulted in again at each op (``large_blocks_from_heap``: a large model's weight-sized
    # copies); glibc's defaults come back after.
    # Gradients are on for the passes, whatever the caller's mode (a scan called inside
    # torch.no_grad() or torch.inference_mode(), a model file that turns them off at import):
    # the backward is half of what a scan checks. A model or batch made inside
    # torch.inference_mode() is scanned through normal copies of its inference tensors.
    with (
        fewer_collections(),
        large_blocks_from_heap(),
        _random_state_kept(),
        torch.autograd.set_detect_anomaly(False),
        torch.inference_mode(False),
        torch.enable_grad(),
        without_inference_tensors(target.model),
    ):
        batch = target.batch.without_inference_tensors()
        if batch is not target.batch:
            target = dataclasses.replace(target, batch=batch)
        return _scan_target(target, settings, fp32_loss, lost_updates)


def _random_state_kept() -> contextlib.AbstractContextManager[None]:
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=cuda)


def _scan_target(
    target: Target, settings: Settings, fp32_loss: bool, lost_updates: LostUpdates | None
) -> Report:
    started = time.perf_counter()
    if settings.dtype == "float32" and settings.mode != "half":
        settings = dataclasses.replace(settings, mode="half")  # FP32: a plain run, no autocast
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
    with user_errors(None, f"the move to {device} (model.to({device!r}))"):
        model = target.model.to(device)  # its modules' own _apply run
    batch = _batch_on(target.batch, device)

    bad = _detected("inputs", ScanEvidence(settings, fmt, batch))
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
    keep = KeptOutputs() if settings.checks_precision and fmt is not FP32 else None
    with _Backward(target, settings, plan, model, batch, keep) as backward:
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
            if backward_origins(low) and scale > 1.0:
                overflowing, scale = scale, 1.0
                skipped += round(math.log2(overflowing))
                why = f"unscaled backward, after an overflow at {scale_text(overflowing)}"
                low, log = backward.run(scale, why)
                if not backward_origins(low) and overflowing > 2.0:
                    # It does not: GradScaler stops at the first scale whose step is finite,
                    # which the window's measurement missed (a gradient it did not see).
                    scale = largest_finite(overflowing, backward.finite)
                    skipped -= round(math.log2(scale))
                    if scale > 1.0:
                        why = f"backward at {scale_text(scale)}, where GradScaler settles"
                        low, log = backward.run(scale, why)
    if low.backward_ran:
        info = dataclasses.replace(info, loss_scaling=_scaling(settings, scale, skipped))
    unchecked = []
    if low.backward_skipped:
        unchecked.append(f"the backward was not analysed: {low.backward_skipped}")
    if low.unseen:
        unchecked.append(
            f"ops the tracer did not see computed the output of {_modules_text(low.unseen)}"
        )
    if low.recomputed:
        unchecked.append(
            f"the forward of {_modules_text(low.recomputed)} recomputed in the backward "
            "(reversible layers, activation checkpointing): not traced op by op; the forward "
            "it repeats was"
        )
    if low.device_queries and settings.predicts_another_device():
        asked, where = low.device_queries[0]
        unchecked.append(f"the path a {settings.policy.upper()} run takes: the forward asked "
                         f"{asked.lstrip('.')} at {Path(where.file).name}:{where.line}")
    info = dataclasses.replace(info, unchecked=tuple(unchecked))
    ref: PassResult | None = None
    broke = bool(forward_origins(low) or backward_origins(low) or failures(low))
    meter = None
    if keep is not None:
        meter = ErrorMeter(keep, fmt, integer_checks(low, fmt))
    if broke or meter is not None:
        announce("FP32 reference pass" + (" (precision check)" if meter is not None else ""))
        compared_pass_start()  # the same dropout masks as the pass it is compared with
        ref = run_pass(
            model,
            _fresh(batch),
            target.loss_fn,
            fp32_context(device),
            fmt,
            backward=bool(backward_origins(low)) or (meter is not None and low.backward_ran),
            fp32=True,
            grad_scale=scale,
            count_all=broke,
            observer=meter,
            # node by node only where the analysis reads it (a backward origin's FP32 node);
            # the precision check's gradient cosine only needs the gradients
            grad_events=bool(backward_origins(low)),
        )
    precision, verdict = None, None
    if meter is not None and keep is not None:
        measured = meter.result()
        keep.release()
        precision = precision_evidence(low, ref, measured, fmt, settings.precision_jump)
        verdict = precision_verdict(low, ref, measured, precision)
    reference = ref
    if ref is None and fp32_loss:  # the loss only: the analysis of a clean pass takes no ref
        reference = _fp32_loss_pass(model, batch, target, device, fmt, scale)
    analysis = analyse(
        low, ref, fmt, upstream_depth=settings.upstream_depth, window=window, grad_scale=scale
    )
    if low.estimated_zeros and analysis.reads_low_zeros:
        # A verdict read zero counts of the low-precision pass (a flush to 0 upstream shows as
        # zeros the FP32 pass does not have, wherever it happens): the forward again, its
        # dropout masks the same, counting every zero, and the analysis again.
        low = backward.recount(low)
        analysis = analyse(
            low, ref, fmt, upstream_depth=settings.upstream_depth, window=window,
            grad_scale=scale,
        )  # fmt: skip
    errors = [
        _finding(c, settings, _fix_device(settings, plan), root_class=type(model).__name__,
                 library=_library(c, target, model))
        for c in (*analysis.failures, *analysis.forward, *analysis.backward)
    ]
    errors = [f for f in errors if f is not None]
    evidence = ScanEvidence(
        settings, fmt, batch, low, log, window, scale, model=model, precision=precision,
        lost_updates=lost_updates,
    )
    half_dtype = f"torch.{settings.dtype}" if settings.mode == "half" else None
    site = [
        with_precision_fix(f, evidence, device=_fix_device(settings, plan), half_dtype=half_dtype,
                           device_from_input=settings.fix_device == "input")
        for f in _detected("pass", evidence)
    ]
    errors += [f for f in site if f.is_error]
    # a NaN loss is never clean: what no error above explains is said to be unexplained
    errors += _detected("final", dataclasses.replace(evidence, errors=tuple(errors)))
    warnings = [f for f in site if not f.is_error]
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
        reference_loss=reference.loss if reference is not None else None,
        range_map=build_range_map(low.events, low.grad_events, fmt, scale),
        precision=precision_work(low.events),
        precision_check=verdict,
    )


def _fp32_loss_pass(
    model: torch.nn.Module,
    batch: Batch,
    target: Target,
    device: str,
    fmt: FloatFormat,
    scale: float,
) -> PassResult | None:
    """One FP32 forward and loss, for the loss only; None when the model cannot run in FP32
    (a patch that casts to ``torch.float16`` by name): the measurement is then missing, the
    scan is not failed for it."""
    announce("FP32 loss of the model")
    compared_pass_start()
    try:
        return run_pass(
            model, _fresh(batch), target.loss_fn, fp32_context(device), fmt, backward=False,
            fp32=True, grad_scale=scale,
        )
    except UserCodeError:
        return None


class _Backward:
    """The low-precision pass at a loss scale, and the loss-scale window measured from it.

    Passes at several loss scales share one forward where the graph can be kept (see
    ``PassRunner``); the model is restored on exit."""

    def __init__(
        self,
        target: Target,
        settings: Settings,
        plan: PrecisionPlan,
        model: torch.nn.Module,
        batch: Batch,
        keep: KeptOutputs | None = None,
    ) -> None:
        self.settings, self.plan = settings, plan
        self._runner = PassRunner(
            model,
            lambda: _fresh(batch),
            target.loss_fn,
            plan.fmt,
            plan.low_precision,
            plan.numerics,
            backward=settings.backward,
            half=settings.mode == "half",
            exact_zeros=False,
            observer=keep,
        )

    def __enter__(self) -> _Backward:
        return self

    def __exit__(self, *exc: object) -> None:
        self._runner.close()

    def run(
        self, scale: float, why: str = "", *, events: bool = True
    ) -> tuple[PassResult, GradientLog | None]:
        """One low-precision pass at loss ``scale``; ``why`` names a repeated one; ``events``:
        trace the backward node by node (the window's passes only measure gradients)."""
        log = GradientLog(self.plan.fmt) if self.plan.emulate and self.settings.backward else None
        settings = self.settings
        backward = " + backward" if settings.backward else ""
        announce(why or f"{settings.dtype} {settings.mode} pass{backward}")
        compared_pass_start()  # a forward run again draws the first one's dropout masks
        return self._runner.run(scale, log, events=events), log

    def finite(self, scale: float) -> bool:
        """Whether the gradients at loss ``scale`` are finite (a pass that only measures
        them)."""
        low, _ = self.run(scale, f"backward at {scale_text(scale)}: finite?", events=False)
        return bool(low.gradients_finite)

    def recount(self, low: PassResult) -> PassResult:
        """``low`` with exact zero counts (``PassRunner.recount``)."""
        announce(f"{self.settings.dtype} {self.settings.mode} forward again, counting every zero")
        return self._runner.recount(low)

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
            why = "unscaled backward for the loss-scale window"
            low, log = self.run(scale, why, events=False)
        needed = log.boundary_low(scale, share)
        if needed is not None and 2.0**needed > scale:
            why = f"backward at {scale_text(2.0**needed)}, the scale a cast boundary needs"
            better, better_log = self.run(2.0**needed, why, events=False)
            if better.gradients_finite and better_log is not None:
                low, log, scale = better, better_log, 2.0**needed
        records = [*low.param_grads.values(), *(b.record for b in log.boundaries)]
        return log.window(scale, share, records)


def _modules_text(modules: tuple[str, ...]) -> str:
    """``a`` or ``a and 3 more modules``."""
    more = len(modules) - 1
    return modules[0] + (f" and {more} more module{'s' if more > 1 else ''}" if more else "")


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


def _library(c: Candidate, target: Target, model: torch.nn.Module) -> LibraryScope | None:
    """For an op inside an installed library, when the model came from a function of the
    user's file: the library's modules around it that hooks from there can keep in FP32."""
    if target.model_fn is None or target.unwrapped or c.event.location is None:
        return None
    if edit_site(c.event) is c.event.location:
        return None  # the user's own code: regions there
    return library_scope(model, c.event.module, ModelSite(target.file, target.model_fn))


def _fix_device(settings: Settings, plan: PrecisionPlan) -> str:
    """The ``device_type`` a fix names where it cannot name its input's device: the device
    the policy predicts (``fix_device: policy``), or the one the scan runs on
    (``fix_device: input``: ``nan-hunter run``, the script's own device)."""
    return plan.device if settings.fix_device == "input" else plan.patch_device


def _finding(
    c: Candidate,
    settings: Settings,
    device: str,
    *,
    root_class: str,
    library: LibraryScope | None = None,
) -> Finding | None:
    rule = classify(c)
    if not settings.rule_enabled(rule.code):
        return None
    plan = rule.fix(c)
    site = edit_site(c.event)
    half_dtype = f"torch.{settings.dtype}" if settings.mode == "half" else None
    fix = (
        build_fix(c, plan, device=device, site=site, half_dtype=half_dtype,
                  root_class=root_class, library=library,
                  device_from_input=settings.fix_device == "input")
        if plan is not None else None
    )
    return origin_finding(
        rule, c, fix=fix, call_site=site if site is not c.event.location else None
    )


def _detected(stage: str, scan: ScanEvidence) -> list[Finding]:
    """The findings of the enabled site rules of ``stage``. Warnings list forward ones in pass
    order, then backward ones in the order their rules give."""
    half = scan.settings.mode == "half"
    found = [
        with_fp16_constant(with_kept_module(finding, scan.settings.dtype), scan.fmt.name)
        if half and rule.keeps_module_in_fp32 else finding
        for rule in site_rules(stage)
        if scan.settings.rule_enabled(rule.code)
        for finding in rule.detect(scan)
    ]
    return sorted(found, key=_site_order)


def _site_order(f: Finding) -> tuple[int, int]:
    return (0, f.op_index or 0) if f.phase is Phase.FORWARD else (1, 0)
