"""``watch``: the per-step check of a training loop, and the scan of the step that broke.

``watch(model, optimizer, scaler)`` wraps an existing loop. Each ``w.step(batch, loss)`` checks,
with one or two host syncs and no per-op work, that the loss is finite, that the gradients are
finite (one fused reduction over all ``.grad``; skipped when a GradScaler already checks them)
and, with a GradScaler, how the loss scale moved: a skipped step is normal while the scale backs
off from its initial value or once in a while later, but ``skip_patience`` skips in a row once the
scale has settled, or a scale below ``scale_floor``, is a problem. On a problem the step's batch
is re-run with full op-level tracing (``nan_hunter.api.scan``) on a deep copy of the unwrapped
model, and the ``Report`` is kept in ``w.reports`` as a ``WatchEvent``; the user's model is never
touched.

Given an optimizer, the watcher also registers a step pre-hook that checks the gradients before
``optimizer.step()`` applies them; when they are bad it copies the model first, so the re-run sees
the weights that step's forward ran with. With a GradScaler it wraps ``clip_grad_norm_`` and
``clip_grad_value_`` to catch clipping of still-scaled gradients. Everything installed is
removed on exit.

Under ``torch.distributed`` (a process group with more than one rank) every ``w.step()`` call
ends with one all-reduce of a small flag vector, so all ranks agree on "problem at this step";
see ``nan_hunter.training.distributed``.

One concept, one file (``Watcher``'s state is shared by its hooks, its per-step check and its
re-run, so they stay together); what ``run`` attaches to a script is ``training.attach``, the
re-run of a real call ``training.rerun``, the copy it runs on ``training.model_copy``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nan_hunter.batch import Batch, LossFn
from nan_hunter.config import Settings
from nan_hunter.errors import ConfigError, NanHunterError, first_line
from nan_hunter.findings import Report
from nan_hunter.options import explicitly_set, settings_with
from nan_hunter.safe_write import write_file
from nan_hunter.training.checks import (
    ScaleWatch,
    bad_grad_names,
    finite_flag,
    grads_finite_flag,
    params_finite,
    scaler_active,
)
from nan_hunter.training.clipping import FIX, ClipGuard, WatchWarning, gradients_scaled
from nan_hunter.training.distributed import (
    OK,
    OWN,
    REPORT_TO,
    SEEN,
    Ranks,
    ReportTo,
    agree,
    choose_origin,
    current_ranks,
    exchange,
    rank_path,
    scanning_ranks,
)
from nan_hunter.training.events import (
    ON_PROBLEM,
    OnProblem,
    TrainingProblem,
    WatchEvent,
    summary_line,
)
from nan_hunter.training.model_copy import (
    full_state,
    replay_copy,
    sharded,
    unwrap_training_objects,
)
from nan_hunter.training.rerun import (
    ModelCall,
    OutputGradientLoss,
    StepPrecision,
    pick_call,
    precision_settings,
)
from nan_hunter.training.step_verdict import Problem, Reason, step_verdict

log = logging.getLogger("nan_hunter")


def _first_grad(params: list[torch.Tensor]) -> torch.Tensor | None:
    return next((p.grad for p in params if p.grad is not None), None)


@dataclass(frozen=True)
class _HookSeen:
    """What the optimizer pre-hook found, tied to the gradient tensors it looked at: a later
    ``w.step`` only uses it for the very same gradients (same tensor, unchanged version)."""

    ok: bool
    snapshot: torch.nn.Module | None
    grad: weakref.ref[torch.Tensor] | None
    version: int

    @classmethod
    def of(cls, params: list[torch.Tensor], ok: bool,
           snapshot: torch.nn.Module | None) -> _HookSeen:
        g = _first_grad(params)
        return cls(ok, snapshot, weakref.ref(g) if g is not None else None,
                   g._version if g is not None else -1)

    def same_gradients(self, params: list[torch.Tensor]) -> bool:
        g = _first_grad(params)
        if g is None or self.grad is None:
            return g is None and self.grad is None
        return self.grad() is g and g._version == self.version


@dataclass(frozen=True)
class _Rerun:
    report: Report | None
    why_not: str | None
    pre_step: bool


class Watcher:
    """See ``watch``. Attributes: ``reports`` (the first ``max_reports`` problem events, each
    with its scan), ``stopped`` (set under ``on_problem="stop"``), ``steps`` (calls to
    ``step``), ``problems`` (all steps that tripped the check), ``skipped`` (steps the GradScaler
    skipped), ``warnings`` (training-loop mistakes, each reported once), ``rank`` and
    ``world_size``."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None,
        *,
        loss_fn: LossFn | None = None,
        settings: Settings | None = None,
        on_problem: OnProblem = "report",
        scale_floor: float = 1.0,
        skip_patience: int = 3,
        max_reports: int = 1,
        report_to: ReportTo = "rank0",
        output: str | Path | None = None,
        rerun_as: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
        unsharded: Callable[[], torch.nn.Module] | None = None,
        **options: Any,
    ) -> None:
        if on_problem not in ON_PROBLEM:
            raise ConfigError(
                f"on_problem must be one of {', '.join(ON_PROBLEM)}, got {on_problem!r}"
            )
        if isinstance(skip_patience, bool) or not isinstance(skip_patience, int) or (
            skip_patience < 1
        ):
            raise ConfigError(f"skip_patience must be a whole number >= 1, got {skip_patience!r}")
        if not math.isfinite(scale_floor) or scale_floor < 0:
            raise ConfigError(f"scale_floor must be a finite number >= 0, got {scale_floor!r}")
        if max_reports < 0:
            raise ConfigError(f"max_reports must be >= 0, got {max_reports!r}")
        if report_to not in REPORT_TO:
            raise ConfigError(
                f"report_to must be one of {', '.join(REPORT_TO)}, got {report_to!r}"
            )
        module, optimizer, scaler = unwrap_training_objects(model, optimizer, scaler)
        self.model = model
        self.module = module
        """The plain module behind ``model`` (DDP, torch.compile, accelerate removed): the one
        copied and scanned."""
        self.optimizer = optimizer
        self.scaler = scaler
        self.loss_fn = loss_fn
        self.on_problem: OnProblem = on_problem
        self.max_reports = max_reports
        self.report_to: ReportTo = report_to
        self.output = Path(output) if output is not None else None
        self.rerun_as = rerun_as
        self.unsharded = unsharded
        """FSDP: builds an unsharded module of the same architecture; on a problem every rank
        gathers the full state dict (a collective, after the ranks agreed) and the scanning rank
        loads it into ``unsharded()`` and re-runs that."""
        """Turns the copy of the model into the module the re-run scans (the Lightning callback
        makes its forward run ``training_step``); None: the copy itself."""
        self.settings = settings_with(settings, options, "nan_hunter.watch()")
        self.reports: list[WatchEvent] = []
        self.warnings: list[WatchWarning] = []
        self.stopped = False
        self.steps = 0
        self.problems = 0
        self._ranks: Ranks | None = current_ranks()
        self._params = list(module.parameters())
        self._scale = (
            ScaleWatch.start(scaler, skip_patience, scale_floor)
            if scaler_active(scaler)
            else None
        )
        self._handles: list[RemovableHandle | _KeeperHandle] = []
        self._calls: list[ModelCall] = []
        """The model's calls since the last ``w.step`` (hook installed by ``with watch``)."""
        self._busy = False
        self._set_aside: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.announce = True
        """Log one warning line per kept problem (the framework callbacks log their own)."""
        self._clip: ClipGuard | None = None
        self._seen: _HookSeen | None = None

    @property
    def rank(self) -> int:
        return self._ranks.rank if self._ranks else 0

    @property
    def world_size(self) -> int:
        return self._ranks.world_size if self._ranks else 1

    @property
    def skipped(self) -> int:
        return self._scale.skipped_total if self._scale is not None else 0

    # ------------------------------------------------------------------ install / remove

    def __enter__(self) -> Watcher:
        if self.optimizer is not None and not self._handles:
            self._handles.append(self.optimizer.register_step_pre_hook(self._before_update))
            self._handles.append(self.optimizer.register_step_post_hook(self._after_update))
        if self.rerun_as is None and not any(
            isinstance(h, _KeeperHandle) for h in self._handles
        ):
            keeper = _CallKeeper(self)
            self._handles.append(_KeeperHandle(
                self.module.register_forward_hook(keeper, with_kwargs=True)
            ))
        if self._scale is not None and self._clip is None:
            self._clip = ClipGuard(
                self._params, lambda: gradients_scaled(self.scaler, self.optimizer),
                self._clipped_scaled,
            )
            self._clip.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Remove everything the watcher installed (``__exit__`` calls it)."""
        handles, self._handles = self._handles, []
        clip, self._clip = self._clip, None
        try:
            for handle in handles:
                handle.remove()
        finally:
            self._seen = None
            self._calls = []
            if clip is not None:
                clip.remove()

    def _clipped_scaled(self, name: str, where: str = "") -> None:
        if any(w.code == "clip_before_unscale" for w in self.warnings):
            return  # reported once
        at = f" at {where}" if where else ""
        warning = WatchWarning(
            code="clip_before_unscale",
            step=self.steps,
            where=where,
            message=(
                f"torch.nn.utils.{name} was called{at} on scaled gradients (before "
                "scaler.unscale_(optimizer)): the threshold applies to gradients multiplied by "
                f"the loss scale ({float(self.scaler.get_scale()):g}), so it clips far too much "
                "and differently as the scale moves"
            ),
            fix=FIX,
        )
        self.warnings.append(warning)
        log.warning("nan-hunter: %s; fix:\n%s", warning.message, warning.fix)

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.before_update()

    def before_update(self) -> None:
        """Are the gradients about to be applied finite? If not, copy the model before the
        update writes them into the weights. The optimizer's step pre-hook calls it; a loop whose
        optimizer computes the gradients inside ``step(closure)`` (Lightning) calls it between
        the backward and the update. (With an enabled GradScaler, ``scaler.step`` only calls
        ``optimizer.step`` when they are finite.)"""
        if self._scale is not None or self._busy:
            return
        flag = grads_finite_flag(self._params)
        ok = flag is None or bool(flag)
        snapshot = None
        if not ok and self._scanned < self.max_reports and not sharded(self.module):
            try:
                snapshot = replay_copy(self.module)
            except Exception:  # not copyable: w.step re-runs the current weights, or says why not
                snapshot = None
        self._seen = _HookSeen.of(self._params, ok, snapshot)
        if not ok and self.optimizer is not None:
            # skip this update, as GradScaler skips a step: NaN must not reach the weights
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    self._set_aside.append((p, p.grad))
                    p.grad = None

    def _after_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        aside, self._set_aside = self._set_aside, []
        for p, grad in aside:
            p.grad = grad

    def keep_call(self, module: torch.nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any], output: Any) -> None:
        """The model's forward hook: keep the call's inputs (by reference), its precision and,
        from the backward, the gradient at its outputs."""
        if self._busy or not torch.is_grad_enabled():
            return
        call = ModelCall(module, args, dict(kwargs), StepPrecision.now(module, args))
        call.watch_outputs(output)
        if call.outputs:
            self._calls.append(call)
            del self._calls[:-_MAX_CALLS]

    @property
    def _scanned(self) -> int:
        """Kept events with a report: a re-run that failed does not use up ``max_reports``."""
        return sum(1 for e in self.reports if e.report is not None)

    # ------------------------------------------------------------------ the per-step check

    def __call__(self, batch: Any = None, loss: torch.Tensor | None = None) -> WatchEvent | None:
        return self.step(batch, loss)

    def step(self, batch: Any = None, loss: torch.Tensor | None = None) -> WatchEvent | None:
        """Check the step that just ran (call it after ``optimizer.step()``, or after
        ``scaler.update()`` with a GradScaler; with gradient accumulation, once per micro-batch
        or once per optimizer step, the same on every rank). ``batch`` is what the model was
        called with (a Tensor, tuple or dict, as for ``scan``); inside ``with watch(...)`` the
        re-run takes the model's inputs from its real call instead (``batch`` is then only what
        ``loss_fn`` receives), else ``batch`` is needed to re-run the step on a problem. Returns
        the event when this step is a problem (on any rank), else None."""
        try:
            return self._step(batch, loss)
        finally:
            self._calls = []

    def _step(self, batch: Any, loss: torch.Tensor | None) -> WatchEvent | None:
        index = self.steps
        self.steps += 1
        seen, self._seen = self._seen, None
        if seen is not None and not seen.same_gradients(self._params):
            seen = None  # the hook saw another step's gradients (w.step came before the update)
        hook_ok = seen.ok if seen is not None else None
        snapshot = seen.snapshot if seen is not None else None

        flags: list[torch.Tensor] = []
        if loss is not None:
            flags.append(torch.isfinite(loss.detach()).all())
        grad_flag = None
        if self._scale is None and hook_ok is None:
            grad_flag = grads_finite_flag(self._params)
            if grad_flag is not None:
                flags.append(grad_flag)
        values: list[bool] = []
        if flags:
            device = flags[0].device
            values = [bool(v) for v in torch.stack([f.to(device) for f in flags]).tolist()]
        loss_ok = values[0] if loss is not None else True
        grads_ok = values[-1] if grad_flag is not None else (hook_ok is not False)

        used: float | None = None
        skipped = False
        scale_problem: Problem | None = None
        if self._scale is not None:
            used, skipped, scale_problem = self._scale.observe(float(self.scaler.get_scale()))
        problem = step_verdict(
            loss=loss, loss_ok=loss_ok, grads_ok=grads_ok, scaled=self._scale is not None,
            scale_problem=scale_problem, bad_grads=lambda: bad_grad_names(self.module),
        )
        if self._ranks is not None:
            code = OK if problem is None else OWN if problem.own_batch else SEEN
            codes = agree(self._ranks, code)
            if not any(codes):
                return None
            return self._distributed_problem(
                index, problem, codes, batch, used, snapshot, skipped
            )
        if problem is None:
            return None
        self.problems += 1
        rerun = self._rerun(problem, batch, used, snapshot, skipped, self._full_state())
        detail = problem.detail + (f" (not scanned: {rerun.why_not})" if rerun.why_not else "")
        event = WatchEvent(
            step=index, reason=problem.reason, report=rerun.report, detail=detail, scale=used,
            pre_step=rerun.pre_step, origin_rank=0 if rerun.report is not None else None,
        )
        return self._finish(event)

    def _distributed_problem(
        self,
        index: int,
        problem: Problem | None,
        codes: list[int],
        batch: Any,
        scale: float | None,
        snapshot: torch.nn.Module | None,
        skipped: bool,
    ) -> WatchEvent:
        """Every rank gets here at the same call: the scanning ranks re-run their step, the
        reports are gathered (on rank 0 or on all), the origin is chosen."""
        assert self._ranks is not None
        ranks = self._ranks
        self.problems += 1
        others = [r for r, c in enumerate(codes) if c and r != ranks.rank]
        if problem is None:
            problem = Problem(
                Reason.OTHER_RANK,
                f"rank {', '.join(map(str, others))} saw a problem at this step",
            )
        rerun = _Rerun(None, None, snapshot is not None or skipped)
        full_state = self._full_state()  # every rank takes part in the gather, or none does
        if ranks.rank in scanning_ranks(codes):
            try:
                rerun = self._rerun(problem, batch, scale, snapshot, skipped, full_state)
            except Exception as exc:  # the other ranks wait in the gather: never leave it
                rerun = _Rerun(
                    None, f"the re-run failed: {type(exc).__name__}: {first_line(exc)}",
                    rerun.pre_step,
                )
        gathered = exchange(ranks, rerun.report, self.report_to)
        if gathered is not None:
            has_error = [None if r is None else r.errors > 0 for r in gathered]
            origin = choose_origin(codes, has_error)
            report = gathered[origin] if origin is not None else None
        else:  # not a receiving rank: it knows the origin only when a rank's own loss broke
            origin = choose_origin(codes, [None] * len(codes)) if OWN in codes else None
            report = rerun.report if origin == ranks.rank else None
            if origin is None and rerun.report is not None:
                report = rerun.report
        detail = problem.detail + (f" (not scanned: {rerun.why_not})" if rerun.why_not else "")
        if origin is not None and origin != ranks.rank:
            detail += f"; origin rank {origin}"
        event = WatchEvent(
            step=index, reason=problem.reason, report=report, detail=detail, scale=scale,
            pre_step=rerun.pre_step, rank=ranks.rank, world_size=ranks.world_size,
            origin_rank=origin,
        )
        return self._finish(event)

    def _full_state(self) -> dict[str, torch.Tensor] | None:
        """FSDP with ``unsharded``: the full state dict (a collective: called on every rank at
        the same agreed problem step, or on none)."""
        if self.unsharded is None or self._scanned >= self.max_reports:
            return None
        return full_state(self.module) if sharded(self.module) else None

    def _rerun(
        self,
        problem: Problem,
        batch: Any,
        scale: float | None,
        snapshot: torch.nn.Module | None,
        skipped: bool,
        full_state: dict[str, torch.Tensor] | None = None,
    ) -> _Rerun:
        pre_step = snapshot is not None or skipped
        if self._scanned >= self.max_reports:
            return _Rerun(None, f"max_reports={self.max_reports} already made", pre_step)
        if batch is None and not self._calls:
            return _Rerun(None, "w.step() was given no batch", pre_step)
        if sharded(self.module):
            return self._rerun_sharded(batch, scale, full_state)
        if not pre_step and not params_finite(self.module):
            return _Rerun(
                None,
                "the optimizer already wrote non-finite values into the weights; pass the "
                "optimizer to watch() so the weights are copied before the update",
                pre_step,
            )
        replay = snapshot
        if replay is None:
            try:
                replay = replay_copy(self.module)
            except Exception as exc:  # a module holding something that cannot be copied
                return _Rerun(None, f"the model cannot be deep-copied: {first_line(exc)}", pre_step)
        return self._scan_replay(replay, batch, scale, pre_step)

    def _rerun_sharded(
        self, batch: Any, scale: float | None, full_state: dict[str, torch.Tensor] | None
    ) -> _Rerun:
        if self.unsharded is None or full_state is None:
            return _Rerun(
                None,
                "FSDP shards the module's parameters: a copy could only run with collectives; "
                "pass unsharded=<a function building the plain model> to watch()",
                False,
            )
        try:
            fresh = self.unsharded()
            fresh.load_state_dict(full_state)
        except Exception as exc:
            return _Rerun(
                None, f"unsharded() did not take the gathered state: {first_line(exc)}", False
            )
        flag = finite_flag(full_state.values())
        if flag is not None and not bool(flag):
            return _Rerun(
                None,
                "the optimizer already wrote non-finite values into the weights; with FSDP call "
                "w.step() after the backward and before optimizer.step()",
                False,
            )
        fresh.train(self.module.training)
        return self._scan_replay(fresh, batch, scale, False)

    def _scan_replay(
        self, replay: torch.nn.Module, batch: Any, scale: float | None, pre_step: bool
    ) -> _Rerun:
        try:
            if self.rerun_as is not None:
                replay = self.rerun_as(replay)
            return _Rerun(self._scan(replay, batch, scale), None, pre_step)
        except NanHunterError as exc:
            return _Rerun(None, f"the re-run failed: {exc}", pre_step)

    def _finish(self, event: WatchEvent) -> WatchEvent:
        if self._scanned < self.max_reports:
            if self.output is not None and event.report is not None:
                path = Path(rank_path(str(self.output), self._ranks))
                path.parent.mkdir(parents=True, exist_ok=True)
                from nan_hunter.report.json_report import render_json  # no terminal libraries

                write_file(path, render_json(event.report))
                event = dataclasses.replace(event, report_path=str(path))
            self.reports.append(event)
            if self.announce and (self._ranks is None or self._ranks.rank == 0):
                log.warning("nan-hunter: %s", summary_line(event))
        if self.on_problem == "stop":
            self.stopped = True
        elif self.on_problem == "raise":
            raise TrainingProblem(event)
        return event

    def _scan(self, replay: torch.nn.Module, batch: Any, scale: float | None) -> Report:
        """The scan models the loss scale the step ran with: the GradScaler's current scale,
        or no scaling without one, unless ``grad_scale`` was set explicitly. With the model's
        real call of this step (``with watch``), the re-run takes its inputs from that call, its
        precision from how the call ran when it ran in FP16/BF16 (unless ``dtype``/``mode`` were
        set), and, without a
        ``loss_fn``, its backward from the real gradient at the model's outputs."""
        from nan_hunter.api import scan

        settings = self.settings
        if not explicitly_set(settings, "grad_scale"):
            settings = dataclasses.replace(settings, grad_scale=scale)
        call = pick_call(self._calls)
        if call is None:
            return scan(replay, batch, self.loss_fn, settings=settings)
        # an FP32 step keeps the configured dtype: a watched FP32 run (a CPU run, a callback's)
        # stands in for the FP16 one it predicts; `nan-hunter run` analyses it in FP32
        settings = precision_settings(settings, call.precision, fp32=False)
        loss_fn = self.loss_fn
        if loss_fn is None:
            real = OutputGradientLoss(call.grads, scale)
            loss_fn = real if real.usable else None
        raw = batch if batch is not None else (call.args, call.kwargs)
        self._busy = True
        try:
            return scan(replay, Batch(call.args, call.kwargs, raw), loss_fn, settings=settings)
        finally:
            self._busy = False


_MAX_CALLS = 64
"""Model calls kept between two ``w.step`` calls (gradient accumulation)."""


class _CallKeeper:
    """The model's forward hook. Deep copies of the model (the re-run's) share it rather than
    copying the watcher with it."""

    def __init__(self, watcher: Watcher) -> None:
        self._watcher = weakref.ref(watcher)

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...],
                 kwargs: dict[str, Any], output: Any) -> None:
        watcher = self._watcher()
        if watcher is not None:
            watcher.keep_call(module, args, kwargs, output)

    def __deepcopy__(self, memo: dict[int, Any]) -> _CallKeeper:
        return self


class _KeeperHandle:
    """The forward hook's handle, told apart from the optimizer's."""

    def __init__(self, handle: RemovableHandle) -> None:
        self._handle = handle

    def remove(self) -> None:
        self._handle.remove()


def watch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any = None,
    *,
    loss_fn: LossFn | None = None,
    settings: Settings | None = None,
    on_problem: OnProblem = "report",
    scale_floor: float = 1.0,
    skip_patience: int = 3,
    max_reports: int = 1,
    report_to: ReportTo = "rank0",
    output: str | Path | None = None,
    unsharded: Callable[[], torch.nn.Module] | None = None,
    **options: Any,
) -> Watcher:
    """Watch a training loop; use as ``with watch(model, optimizer, scaler) as w:`` and call
    ``w.step(batch, loss)`` once per step (after ``scaler.update()``).

    ``model``, ``optimizer`` and ``scaler`` may be what DDP, ``torch.compile`` or accelerate's
    ``Accelerator.prepare`` returned (the scaler is taken from an ``AcceleratedOptimizer`` when
    not given). ``loss_fn(output, batch)`` is the loss the re-run uses (None: the sum of the
    output's means, as ``scan``). ``settings`` and ``options`` (config keys by name: ``dtype``,
    ``device``, ``policy``, ...) configure that scan; unless ``grad_scale`` is set, the scan
    uses the loss scale the failing step ran with (the GradScaler's, or none without one).
    ``on_problem``: ``"report"`` records the event, ``"stop"`` also sets ``w.stopped``,
    ``"raise"`` raises ``TrainingProblem``. ``skip_patience``: skipped steps in a row (after the
    scale settled) that count as a problem; ``scale_floor``: a scale below it is a problem;
    ``max_reports``: re-runs and keeps at most this many problems (all are counted in
    ``w.problems``). A re-run that fails (a model that cannot be deep-copied, an error in the
    user's code) does not stop the loop: the event's ``report`` is None and its ``detail`` says
    why. ``output``: write each kept report as JSON there (``nan.json``; per rank
    ``nan.rank1.json`` under torch.distributed).

    Under torch.distributed every rank must call ``w.step()`` equally often: the ranks agree on
    each call (one all-reduce), so with ``"stop"`` all stop at the same call and with
    ``"raise"`` all raise. ``report_to``: ``"rank0"`` (default) or ``"all"``: which ranks receive
    the origin rank's report in their event; rank 0 logs a one-line summary. FSDP: a sharded
    module is only re-run given ``unsharded`` (a function building the plain model): all ranks
    then gather the full state dict and the scanning rank loads it into ``unsharded()``; call
    ``w.step()`` before ``optimizer.step()`` there, as the weights cannot be copied before it.

    The re-run uses a deep copy of the model, so RNG-dependent layers (dropout) draw fresh
    random numbers; the user's model, its ``.grad`` and the optimizer are never modified.
    """
    return Watcher(
        model, optimizer, scaler, loss_fn=loss_fn, settings=settings, on_problem=on_problem,
        scale_floor=scale_floor, skip_patience=skip_patience, max_reports=max_reports,
        report_to=report_to, output=output, unsharded=unsharded, **options,
    )
