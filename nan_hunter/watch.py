"""Watch a training loop: a cheap per-step check, and a full scan of the step that broke.

``watch(model, optimizer, scaler)`` wraps an existing loop. Each ``w.step(batch, loss)`` checks,
with one or two host syncs and no per-op work, that the loss is finite, that the gradients are
finite (one fused reduction over all ``.grad``; skipped when a GradScaler already checks them)
and, with a GradScaler, how the loss scale moved: a skipped step is normal while the scale backs
off from its initial value or once in a while later, but ``skip_patience`` skips in a row once the
scale has settled, or a scale below ``scale_floor``, is a problem. On a problem the step's batch
is re-run with full op-level tracing (``nan_hunter.api.scan``) on a deep copy of the model, and
the ``Report`` is kept in ``w.reports`` as a ``WatchEvent``; the user's model is never touched.

Given an optimizer, the watcher also registers a step pre-hook that checks the gradients before
``optimizer.step()`` applies them; when they are bad it copies the model first, so the re-run sees
the weights that step's forward ran with. Everything installed is removed on exit.

``run_steps`` is the same check for the CLI's ``--steps N``: it trains a copy of the target on
its batch and scans the first step that breaks, from the weights at the start of that step.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import torch
from torch.utils._pytree import tree_map
from torch.utils.hooks import RemovableHandle

from nan_hunter.config import Settings, load_settings
from nan_hunter.errors import ConfigError, NanHunterError, UserCodeError, first_line
from nan_hunter.findings import Report
from nan_hunter.loader import Target
from nan_hunter.precision.formats import format_for
from nan_hunter.progress import announce
from nan_hunter.runner import Batch, LossFn, default_loss

OnProblem = Literal["report", "raise", "stop"]
DEFAULT_LR = 1e-3
"""Adam's learning rate in ``run_steps`` when neither the call nor the settings give one."""
_ON_PROBLEM = ("report", "raise", "stop")


class Reason(str, enum.Enum):
    """Why a step counts as a problem."""

    LOSS = "non_finite_loss"
    """The loss is NaN or inf (always a problem: loss scaling cannot fix the forward)."""
    GRADIENT = "non_finite_gradient"
    """A gradient is NaN or inf and no (enabled) GradScaler handles it."""
    SKIPPED = "skipped_steps"
    """GradScaler skipped ``skip_patience`` steps in a row after its scale had settled."""
    SCALE_COLLAPSE = "scale_collapse"
    """GradScaler's scale fell below ``scale_floor``."""


@dataclass(frozen=True)
class WatchEvent:
    """A step that tripped the watcher, and the scan of it."""

    step: int
    """0-based index of the ``w.step()`` call (``run_steps``: of the optimizer step)."""
    reason: Reason
    report: Report | None
    """The scan of the step's batch; None when it could not be re-run (``detail`` says why)."""
    detail: str = ""
    """One line for a person: what was seen."""
    scale: float | None = None
    """The loss scale this step ran with (None without an enabled GradScaler)."""
    pre_step: bool = False
    """True when the re-run used the weights this step's forward ran with (the GradScaler
    skipped the step, or the optimizer pre-hook copied the model before the update); False
    when it used the weights after the optimizer step."""


class TrainingProblem(NanHunterError):
    """Raised by ``w.step()`` under ``on_problem="raise"``; ``event`` says what happened."""

    def __init__(self, event: WatchEvent) -> None:
        self.event = event
        message = f"training step {event.step}: {event.detail or event.reason.value}"
        first = event.report.findings[0] if event.report and event.report.findings else None
        if first is not None:
            where = f" at {first.location.render()}" if first.location else ""
            message += f"; first finding {first.code} {first.op or 'input'}{where}"
        super().__init__(message)


@dataclass(frozen=True)
class StepsResult:
    """What ``run_steps`` found."""

    steps_run: int
    """Optimizer steps attempted, the bad one included."""
    first_bad_step: int | None
    """0-based index of the first step that tripped the check; None when none did."""
    report: Report
    """The scan of the first bad step (from the weights at its start), or of the final weights
    when no step went bad."""
    reason: Reason | None = None
    detail: str = ""


# --------------------------------------------------------------------------- the cheap checks


def finite_flag(tensors: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """A 0-dim bool tensor: every element of ``tensors`` is finite. No host sync; None when
    there is nothing to check.

    On a GPU: one fused max-abs reduction per device (``_foreach_norm`` with ``ord=inf``: NaN
    and inf propagate, and unlike a 2-norm it cannot overflow on finite FP16). On a CPU, where
    that reduction is slow, one sum per tensor, accumulated in at least FP32: NaN and inf
    propagate too; only a sum beyond FP32's range (about 3.4e38, far past any gradient an
    optimizer can use) would also read as non-finite."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if t.is_sparse:
            t = t.coalesce().values()
        if t.numel() and (t.is_floating_point() or t.is_complex()):
            by_device.setdefault(t.device, []).append(t)
    if not by_device:
        return None
    with torch.no_grad():
        flags = [_group_finite(group) for group in by_device.values()]
        if len(flags) == 1:
            return flags[0]
        first = flags[0].device
        return torch.stack([f.to(first) for f in flags]).all()


_LOW = (torch.float16, torch.bfloat16)


def _group_finite(group: list[torch.Tensor]) -> torch.Tensor:
    if group[0].device.type == "cpu":
        sums = [t.sum(dtype=torch.float32) if t.dtype in _LOW else t.sum() for t in group]
        return torch.stack(sums).isfinite().all()
    return torch.stack(torch._foreach_norm(group, math.inf)).isfinite().all()


def grads_finite_flag(params: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """``finite_flag`` over the ``.grad`` of ``params`` (None when none has one)."""
    return finite_flag(p.grad for p in params if p.grad is not None)


def _scaler_active(scaler: Any) -> bool:
    return scaler is not None and bool(scaler.is_enabled())


@dataclass
class _ScaleWatch:
    """GradScaler's scale from step to step: skips, streaks of them, and a collapse."""

    patience: int
    floor: float
    used: float
    """The scale the coming step runs with."""
    settled: bool
    """A step has gone through since the start (or the scale had already backed off from its
    initial value): skips before that are the scaler searching down from ``init_scale``."""
    in_row: int = 0
    below_floor: bool = False
    skipped_total: int = 0

    @classmethod
    def start(cls, scaler: Any, patience: int, floor: float) -> _ScaleWatch:
        scale = float(scaler.get_scale())
        initial = float(getattr(scaler, "_init_scale", scale))
        return cls(patience=patience, floor=floor, used=scale, settled=scale < initial)

    def observe(self, now: float) -> tuple[float, bool, tuple[Reason, str] | None]:
        """The scale after ``scaler.update()``: (scale the step ran with, skipped, problem)."""
        used, self.used = self.used, now
        skipped = now < used
        if skipped:
            self.in_row += 1
            self.skipped_total += 1
        else:
            self.in_row = 0
            self.settled = True
        problem: tuple[Reason, str] | None = None
        if now < self.floor:
            if not self.below_floor:
                problem = (
                    Reason.SCALE_COLLAPSE,
                    f"the loss scale fell to {now:g}, below scale_floor {self.floor:g}: the "
                    "gradients are not finite even at a tiny scale",
                )
            self.below_floor = True
        else:
            self.below_floor = False
        if problem is None and skipped and self.settled and self.in_row == self.patience:
            problem = (
                Reason.SKIPPED,
                f"GradScaler skipped {self.in_row} steps in a row (scale now {now:g}): the "
                "gradients overflow at every scale it tried",
            )
        return used, skipped, problem


def _bad_grad_names(model: torch.nn.Module) -> str:
    """Names of the parameters with non-finite gradients (run only on a problem)."""
    bad = [
        name
        for name, p in model.named_parameters()
        if p.grad is not None and not bool(torch.isfinite(p.grad.detach()).all())
    ]
    if not bad:
        return ""
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return f" in {bad[0]}{more}"


def _params_finite(model: torch.nn.Module) -> bool:
    flag = finite_flag([*model.parameters(), *model.buffers()])
    return flag is None or bool(flag)


# --------------------------------------------------------------------------- the watcher


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


def _scan_settings(settings: Settings | None, options: dict[str, Any]) -> Settings:
    """``settings`` (or the defaults) with ``options`` applied; options are validated as
    config keys, so a typo fails when the watcher is made, not at the first problem."""
    checked = {name: _option_value(value) for name, value in options.items()}
    try:
        given = load_settings(None, checked)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith("command line: "):
            message = "nan_hunter.watch(): " + message.removeprefix("command line: ")
        raise ConfigError(message) from None
    if settings is None:
        return given
    changed = {k: getattr(given, k) for k, v in checked.items() if v is not None}
    return dataclasses.replace(settings, **changed)


def _option_value(value: Any) -> Any:
    """As ``scan`` takes options: ``torch.float16`` for ``"float16"``, any sequence of codes."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    return value


class Watcher:
    """See ``watch``. Attributes: ``reports`` (the first ``max_reports`` problem events, each
    with its scan), ``stopped`` (set under ``on_problem="stop"``), ``steps`` (calls to
    ``step``), ``problems`` (all steps that tripped the check), ``skipped`` (steps the GradScaler
    skipped)."""

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
        **options: Any,
    ) -> None:
        if on_problem not in _ON_PROBLEM:
            raise ConfigError(
                f"on_problem must be one of {', '.join(_ON_PROBLEM)}, got {on_problem!r}"
            )
        if isinstance(skip_patience, bool) or not isinstance(skip_patience, int) or (
            skip_patience < 1
        ):
            raise ConfigError(f"skip_patience must be a whole number >= 1, got {skip_patience!r}")
        if not math.isfinite(scale_floor) or scale_floor < 0:
            raise ConfigError(f"scale_floor must be a finite number >= 0, got {scale_floor!r}")
        if max_reports < 0:
            raise ConfigError(f"max_reports must be >= 0, got {max_reports!r}")
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.loss_fn = loss_fn
        self.on_problem: OnProblem = on_problem
        self.max_reports = max_reports
        self.settings = _scan_settings(settings, options)
        self.reports: list[WatchEvent] = []
        self.stopped = False
        self.steps = 0
        self.problems = 0
        self._params = list(model.parameters())
        self._scale = (
            _ScaleWatch.start(scaler, skip_patience, scale_floor)
            if _scaler_active(scaler)
            else None
        )
        self._handles: list[RemovableHandle] = []
        self._seen: _HookSeen | None = None

    @property
    def skipped(self) -> int:
        return self._scale.skipped_total if self._scale is not None else 0

    # ------------------------------------------------------------------ install / remove

    def __enter__(self) -> Watcher:
        if self.optimizer is not None and not self._handles:
            self._handles.append(self.optimizer.register_step_pre_hook(self._before_update))
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
        try:
            for handle in handles:
                handle.remove()
        finally:
            self._seen = None

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Optimizer step pre-hook: are the gradients about to be applied finite? If not, copy
        the model before the update writes them into the weights. (With an enabled GradScaler,
        ``scaler.step`` only calls ``optimizer.step`` when they are finite.)"""
        if self._scale is not None:
            return
        flag = grads_finite_flag(self._params)
        ok = flag is None or bool(flag)
        snapshot = None
        if not ok and len(self.reports) < self.max_reports:
            try:
                snapshot = copy.deepcopy(self.model)
            except Exception:  # not copyable: w.step re-runs the current weights, or says why not
                snapshot = None
        self._seen = _HookSeen.of(self._params, ok, snapshot)

    # ------------------------------------------------------------------ the per-step check

    def __call__(self, batch: Any = None, loss: torch.Tensor | None = None) -> WatchEvent | None:
        return self.step(batch, loss)

    def step(self, batch: Any = None, loss: torch.Tensor | None = None) -> WatchEvent | None:
        """Check the step that just ran (call it after ``optimizer.step()``, or after
        ``scaler.update()`` with a GradScaler). ``batch`` is what the model was called with (a
        Tensor, tuple or dict, as for ``scan``); it is needed to re-run the step on a problem.
        Returns the event when this step is a problem, else None."""
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
        problem: tuple[Reason, str] | None = None
        if self._scale is not None:
            used, skipped, problem = self._scale.observe(float(self.scaler.get_scale()))
        if not loss_ok:
            assert loss is not None
            problem = (Reason.LOSS, f"the loss is {float(loss.detach().float()):g}")
        elif not grads_ok and self._scale is None:
            problem = (Reason.GRADIENT, "non-finite gradient" + _bad_grad_names(self.model))
        if problem is None:
            return None
        return self._problem(index, problem, batch, used, snapshot, skipped)

    def _problem(
        self,
        index: int,
        problem: tuple[Reason, str],
        batch: Any,
        scale: float | None,
        snapshot: torch.nn.Module | None,
        skipped: bool,
    ) -> WatchEvent:
        self.problems += 1
        reason, detail = problem
        pre_step = snapshot is not None or skipped
        kept = len(self.reports) < self.max_reports
        report = None
        why_not = None
        if not kept:
            why_not = f"max_reports={self.max_reports} already made"
        elif batch is None:
            why_not = "w.step() was given no batch"
        elif not pre_step and not _params_finite(self.model):
            why_not = (
                "the optimizer already wrote non-finite values into the weights; pass the "
                "optimizer to watch() so the weights are copied before the update"
            )
        else:
            replay = snapshot
            if replay is None:
                try:
                    replay = copy.deepcopy(self.model)
                except Exception as exc:  # a module holding something that cannot be copied
                    why_not = f"the model cannot be deep-copied: {first_line(exc)}"
            if replay is not None:
                try:
                    report = self._scan(replay, batch, scale)
                except NanHunterError as exc:
                    why_not = f"the re-run failed: {exc}"
        if why_not is not None:
            detail += f" (not scanned: {why_not})"
        event = WatchEvent(
            step=index, reason=reason, report=report, detail=detail, scale=scale,
            pre_step=pre_step,
        )
        if kept:
            self.reports.append(event)
        if self.on_problem == "stop":
            self.stopped = True
        elif self.on_problem == "raise":
            raise TrainingProblem(event)
        return event

    def _scan(self, replay: torch.nn.Module, batch: Any, scale: float | None) -> Report:
        from nan_hunter.api import scan

        settings = self.settings
        if scale is not None and settings.grad_scale is None:
            settings = dataclasses.replace(settings, grad_scale=scale)
        return scan(replay, batch, self.loss_fn, settings=settings)


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
    **options: Any,
) -> Watcher:
    """Watch a training loop; use as ``with watch(model, optimizer, scaler) as w:`` and call
    ``w.step(batch, loss)`` once per step (after ``scaler.update()``).

    ``loss_fn(output, batch)`` is the loss the re-run uses (None: the sum of the output's
    means, as ``scan``). ``settings`` and ``options`` (config keys by name: ``dtype``,
    ``device``, ``policy``, ...) configure that scan; with an enabled GradScaler and no
    ``grad_scale`` set, the scan uses the scale the failing step ran with. ``on_problem``:
    ``"report"`` records the event, ``"stop"`` also sets ``w.stopped``, ``"raise"`` raises
    ``TrainingProblem``. ``skip_patience``: skipped steps in a row (after the scale settled) that
    count as a problem; ``scale_floor``: a scale below it is a problem; ``max_reports``: re-runs
    and keeps at most this many problems (all are counted in ``w.problems``). A re-run that
    fails (a model that cannot be deep-copied, an error in the user's code) does not stop the
    loop: the event's ``report`` is None and its ``detail`` says why.

    The re-run uses a deep copy of the model, so RNG-dependent layers (dropout) draw fresh
    random numbers; the user's model, its ``.grad`` and the optimizer are never modified.
    """
    return Watcher(
        model, optimizer, scaler, loss_fn=loss_fn, settings=settings, on_problem=on_problem,
        scale_floor=scale_floor, skip_patience=skip_patience, max_reports=max_reports, **options,
    )


# --------------------------------------------------------------------------- run_steps


def _batch_copy(batch: Batch, device: str, dtype: torch.dtype | None = None) -> Batch:
    """A copy of ``batch`` on ``device`` (floating tensors in ``dtype`` when given), fresh for
    each step: a model or loss that writes into its inputs must not change the next step's."""

    def move(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        cast = dtype if dtype is not None and x.is_floating_point() else x.dtype
        return x.to(device=device, dtype=cast, copy=True)

    return Batch(args=tree_map(move, batch.args), kwargs=tree_map(move, batch.kwargs),
                 raw=tree_map(move, batch.raw))


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_steps(
    target: Target,
    settings: Settings,
    steps: int,
    *,
    lr: float | None = None,
    skip_patience: int = 3,
    scale_floor: float = 1.0,
) -> StepsResult:
    """Train a deep copy of ``target.model`` for up to ``steps`` Adam steps on ``target.batch``
    and scan the first step that breaks, as ``watch`` checks it. The learning rate is ``lr``,
    else the ``lr`` setting when the configuration has one, else ``DEFAULT_LR`` (1e-3).

    Training runs on the scan's device under real ``torch.autocast`` in the scan's dtype
    (``mode: half``: model and batch in that dtype, no autocast), with a GradScaler whose
    initial scale is ``settings.grad_scale`` when that is set. The scan of a bad step starts
    from the weights at the start of that step, restored into a fresh copy of the model (with a
    GradScaler, at the scale that step ran with). ``target.model`` is left bit-identical; the
    run holds a copy of the model, one of its state and Adam's two moments besides it.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"--steps must be a whole number >= 1, got {steps!r}")
    if lr is None:
        lr = float(getattr(settings, "lr", DEFAULT_LR))
    if not math.isfinite(lr) or lr <= 0:
        raise ConfigError(f"lr must be a finite number > 0, got {lr!r}")
    device = settings.resolved_device()
    dtype = format_for(settings.dtype).dtype
    half = settings.mode == "half"
    if half and settings.grad_scale is not None:
        raise ConfigError(
            "--steps with --mode half cannot use --grad-scale: GradScaler does not unscale "
            "FP16 gradients"
        )
    model = copy.deepcopy(target.model).to(device)
    if half:
        model.to(dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("--steps trains the model, but it has no parameter that requires grad")
    optimizer = torch.optim.Adam(params, lr=lr)
    scaler = torch.amp.GradScaler(device, init_scale=settings.grad_scale) if (
        settings.grad_scale is not None
    ) else None
    scale = _ScaleWatch.start(scaler, skip_patience, scale_floor) if scaler else None

    for index in range(steps):
        announce(f"training step {index + 1}/{steps}")
        start = _state(model)
        optimizer.zero_grad(set_to_none=True)
        batch = _batch_copy(target.batch, device, dtype if half else None)
        loss = _train_forward(model, batch, target.loss_fn, device, dtype, half, index)
        try:
            (scaler.scale(loss) if scaler is not None else loss).backward()
        except NanHunterError:
            raise
        except Exception as exc:
            raise UserCodeError(
                f"{type(exc).__name__} in the backward of training step {index}: "
                f"{first_line(exc)}"
            ) from exc
        problem: tuple[Reason, str] | None = None
        used = None
        if scaler is not None and scale is not None:
            scaler.step(optimizer)
            scaler.update()
            used, _, problem = scale.observe(float(scaler.get_scale()))
            loss_ok = bool(torch.isfinite(loss.detach()).all())
        else:
            flag = grads_finite_flag(params)
            flags = torch.stack([torch.isfinite(loss.detach()).all(), *(
                [flag.to(loss.device)] if flag is not None else [])])
            loss_ok, *rest = (bool(v) for v in flags.tolist())
            if rest and not rest[0]:
                problem = (Reason.GRADIENT, "non-finite gradient" + _bad_grad_names(model))
            elif loss_ok:
                optimizer.step()
        if not loss_ok:
            problem = (Reason.LOSS, f"the loss is {float(loss.detach().float()):g}")
        if problem is not None:
            report = _scan_state(target, settings, start, used)
            return StepsResult(index + 1, index, report, problem[0], problem[1])
    final = _scan_state(target, settings, model.state_dict(), scale.used if scale else None)
    return StepsResult(steps, None, final)


def _scan_state(
    target: Target, settings: Settings, state: dict[str, torch.Tensor], scale: float | None
) -> Report:
    """Scan a fresh copy of ``target.model`` holding ``state``; with a GradScaler, at the loss
    scale the step ran with (as the watcher does)."""
    from nan_hunter.engine import scan_target

    fresh = copy.deepcopy(target.model)
    fresh.load_state_dict(state)
    if scale is not None:
        settings = dataclasses.replace(settings, grad_scale=scale)
    return scan_target(dataclasses.replace(target, model=fresh), settings)


def _train_forward(
    model: torch.nn.Module,
    batch: Batch,
    loss_fn: LossFn | None,
    device: str,
    dtype: torch.dtype,
    half: bool,
    index: int,
) -> torch.Tensor:
    precision = torch.autocast(device_type=device, dtype=dtype, enabled=not half)
    try:
        with precision:
            output = model(*batch.args, **batch.kwargs)
            loss = loss_fn(output, batch.raw) if loss_fn is not None else default_loss(output)
    except NanHunterError:
        raise
    except Exception as exc:
        raise UserCodeError(
            f"{type(exc).__name__} in training step {index}: {first_line(exc)}"
        ) from exc
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise UserCodeError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}")
    return loss.float() if half else loss
