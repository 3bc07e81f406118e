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

``Watcher`` holds the state its hooks and its per-step check share; the optimizer pre-hook's
look at the gradients is ``training.pre_step``, the re-run of a problem step
``training.watch_rerun`` (from the real call, ``training.rerun``; on a copy,
``training.model_copy``), the ranks' agreement ``training.distributed``. What ``run`` attaches
to a script is ``training.attach``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nan_hunter.core.batch import LossFn
from nan_hunter.core.safe_write import write_file
from nan_hunter.errors import ConfigError, first_line
from nan_hunter.findings import TrainingSteps
from nan_hunter.project.config import Settings
from nan_hunter.project.options import settings_with
from nan_hunter.trace import torch_originals as real
from nan_hunter.training.checks import (
    ScaleWatch,
    bad_grad_names,
    grads_finite_flag,
    scaler_active,
)
from nan_hunter.training.clipping import FIX, ClipGuard, WatchWarning, gradients_scaled
from nan_hunter.training.diagnosis import Repeats, StepSeen, diagnose
from nan_hunter.training.distributed import (
    OK,
    OWN,
    REPORT_TO,
    SEEN,
    Ranks,
    ReportTo,
    agree,
    current_ranks,
    rank_path,
    scanning_ranks,
    settle,
)
from nan_hunter.training.events import (
    ON_PROBLEM,
    OnProblem,
    TrainingProblem,
    WatchEvent,
    summary_line,
)
from nan_hunter.training.model_copy import sharded, unwrap_training_objects
from nan_hunter.training.pre_step import PreStepCheck
from nan_hunter.training.rerun import (
    CallKeeper,
    KeeperHandle,
    ModelCall,
    StepPrecision,
    pick_call,
    reaches_parameters,
)
from nan_hunter.training.step_verdict import Problem, Reason, step_verdict
from nan_hunter.training.watch_rerun import Rerun, StepRerun

log = logging.getLogger("nan_hunter")


REPLACED_MODEL = (
    "the step's loss was not computed from the watched model's parameters (was the model "
    "replaced, e.g. reloaded? a new model needs its own watch()): the model that ran this "
    "step is not the one watched, and re-running the watched one would report on another model"
)


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
        self._handles: list[RemovableHandle | KeeperHandle] = []
        self._calls: list[ModelCall] = []
        """The model's calls since the last ``w.step`` (hook installed by ``with watch``)."""
        self._busy = False
        self.announce = True
        """Log one warning line per kept problem (the framework callbacks log their own)."""
        self._clip: ClipGuard | None = None
        self._pre_step = PreStepCheck(module, self._params, optimizer)

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
            isinstance(h, KeeperHandle) for h in self._handles
        ):
            keeper = CallKeeper(self)
            self._handles.append(KeeperHandle(
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
            self._pre_step.clear()
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
        update writes them into the weights, and skip the update (``training.pre_step``). The
        optimizer's step pre-hook calls it; a loop whose optimizer computes the gradients inside
        ``step(closure)`` (Lightning) calls it between the backward and the update. (With an
        enabled GradScaler, ``scaler.step`` only calls ``optimizer.step`` when they are
        finite.)"""
        if self._scale is not None or self._busy:
            return
        self._pre_step.before(copy=self._scanned < self.max_reports)

    def _after_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._pre_step.after()

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
        seen = self._pre_step.take()
        hook_ok = seen.ok if seen is not None else None
        snapshot = seen.snapshot if seen is not None else None

        flags: list[torch.Tensor] = []
        if loss is not None:
            flags.append(real.isfinite(loss.detach()).all())
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
                index, problem, codes, batch, used, snapshot, skipped, loss
            )
        if problem is None:
            return None
        self.problems += 1
        rerun = self._rerun(problem, batch, used, snapshot, skipped, self._full_state(), loss)
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
        loss: torch.Tensor | None = None,
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
        rerun = Rerun(None, None, snapshot is not None or skipped)
        full_state = self._full_state()  # every rank takes part in the gather, or none does
        if ranks.rank in scanning_ranks(codes):
            try:
                rerun = self._rerun(problem, batch, scale, snapshot, skipped, full_state, loss)
            except Exception as exc:  # the other ranks wait in the gather: never leave it
                rerun = Rerun(
                    None, f"the re-run failed: {type(exc).__name__}: {first_line(exc)}",
                    rerun.pre_step,
                )
        report, origin = settle(ranks, codes, rerun.report, self.report_to)
        detail = problem.detail + (f" (not scanned: {rerun.why_not})" if rerun.why_not else "")
        if origin is not None and origin != ranks.rank:
            detail += f"; origin rank {origin}"
        event = WatchEvent(
            step=index, reason=problem.reason, report=report, detail=detail, scale=scale,
            pre_step=rerun.pre_step, rank=ranks.rank, world_size=ranks.world_size,
            origin_rank=origin,
        )
        return self._finish(event)

    def _rerun_step(self) -> StepRerun:
        """How a problem step is re-run, from the watcher's current configuration."""
        return StepRerun(self.module, self.settings, self.loss_fn, self.rerun_as, self.unsharded)

    def _full_state(self) -> dict[str, torch.Tensor] | None:
        """FSDP with ``unsharded``: the full state dict, unless no re-run is left to make (a
        collective: called on every rank at the same agreed problem step, or on none)."""
        if self._scanned >= self.max_reports:
            return None
        return self._rerun_step().full_state()

    def _rerun(
        self,
        problem: Problem,
        batch: Any,
        scale: float | None,
        snapshot: torch.nn.Module | None,
        skipped: bool,
        full_state: dict[str, torch.Tensor] | None = None,
        loss: torch.Tensor | None = None,
    ) -> Rerun:
        if self._scanned >= self.max_reports:
            made = f"max_reports={self.max_reports} already made"
            return Rerun(None, made, snapshot is not None or skipped)
        if (loss is not None and not sharded(self.module)  # FSDP's leaves are its shards
                and reaches_parameters(loss, self._params) is False):
            return Rerun(None, REPLACED_MODEL, snapshot is not None or skipped)
        self._busy = True  # the re-run's own forward and optimizer calls are not the loop's
        try:
            rerun = self._rerun_step().run(
                batch, self._calls, scale, snapshot, skipped, full_state
            )
        finally:
            self._busy = False
        return self._with_verdict(rerun, problem)

    def _with_verdict(self, rerun: Rerun, problem: Problem) -> Rerun:
        """The re-run's report with the verdict on the step's cause (``training.diagnosis``),
        from what the step showed and its one re-run, in ``report.training``."""
        if rerun.report is None:
            return rerun
        seen = StepSeen.of(pick_call(self._calls), problem)
        model = type(self.module).__name__
        verdict, evidence = diagnose(rerun.report, seen, Repeats(model))
        training = TrainingSteps(
            steps_checked=self.steps - 1, problem_step=self.steps, verdict=verdict,
            evidence=evidence,
        )
        return dataclasses.replace(
            rerun, report=dataclasses.replace(rerun.report, training=training)
        )

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


_MAX_CALLS = 64
"""Model calls kept between two ``w.step`` calls (gradient accumulation)."""


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
