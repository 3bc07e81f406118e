"""``ScriptWatch``: the checks of ``watch``, attached to a script that knows nothing of them.

``nan-hunter run train.py`` installs one of these before the script starts. It sees the
training loop only through torch's public global hooks and two methods of ``GradScaler``:

- ``register_module_forward_pre_hook``/``register_module_forward_hook``: the outermost call of
  a module with trainable parameters, while gradients are enabled, is the model call of the
  step; its inputs are kept by reference and a hook on each floating output keeps the gradient
  that reaches it (``rerun.ModelCall``). Calls inside it cost one counter update each.
- ``torch.autograd.backward`` (replaced on the module): the tensors a backward starts from are
  the step's loss, however the backward was started: ``loss.backward()`` (``Tensor.backward``
  calls it, so each backward is seen once), ``torch.autograd.backward(loss)`` or ``([loss])``,
  ``from torch.autograd import backward`` in the script (which runs after the replacement),
  ``accelerator.backward(loss)``, ``scaler.scale(loss).backward()``. A backward started inside
  another one (reentrant checkpointing) is not a loss.
- after each backward, while no torch optimizer has been seen (a script that updates its
  weights by hand, or the first micro-batches of gradient accumulation): its loss is checked
  there (one host sync per backward); a non-finite one is a problem step numbered by the
  backward's count. Once a torch optimizer steps, the loss waits for the optimizer's check.
- ``register_optimizer_step_pre_hook``: without a GradScaler, the step boundary: the loss and
  the gradients about to be applied are checked there (one host sync); with one, only the loss
  (GradScaler already checked the gradients).
- ``GradScaler.step``/``update`` (wrapped): the scale from step to step (``ScaleWatch``); from
  the first ``scaler.step(optimizer)`` on, clipping that optimizer's still-scaled gradients
  (``clip_grad_norm_`` before ``scaler.unscale_``, imported by any name) is one warning.

On a problem the update is not applied (the gradients are set aside while ``optimizer.step``
runs and put back after it, as GradScaler skips a step), the step's model call is re-run on a
copy of the model with the weights the step ran with, through the scan engine
(``rerun.rerun_call``), and ``on_problem(event)`` decides what happens next. An FSDP2 model is
copied from the full state every rank gathers at that step (``model_copy.gather_full_state``,
``unsharded_copy``). Everything is removed by ``close``. Nothing runs per op. The replacements
of torch's functions are ``training.script_patches``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.hooks import RemovableHandle

from nan_hunter.core.shared_patch import SharedPatch
from nan_hunter.core.spikes import SpikeRule, SpikeWatch
from nan_hunter.engine.pass_state import rng_state
from nan_hunter.errors import InternalError, NanHunterError, first_line
from nan_hunter.findings import Report, TrainingSteps
from nan_hunter.precision.formats import format_for
from nan_hunter.precision.lost_updates import FIX as LOST_FIX
from nan_hunter.precision.lost_updates import LOST_SHARE, LostUpdates, UpdateSnapshot
from nan_hunter.project.config import Settings
from nan_hunter.project.loader import unwrap_model
from nan_hunter.trace import torch_originals as real
from nan_hunter.training import script_patches
from nan_hunter.training.checks import (
    OptimizerStep,
    ScaleWatch,
    bad_optimizer_grads,
    grads_finite_flag,
)
from nan_hunter.training.clipping import FIX, ClipGuard, WatchWarning, gradients_scaled
from nan_hunter.training.diagnosis import (
    Repeats,
    StepSeen,
    changed_inputs,
    changed_state,
    diagnose,
    input_versions,
    plain_state,
)
from nan_hunter.training.distributed import (
    OK,
    OWN,
    SEEN,
    Ranks,
    agree,
    current_ranks,
    scanning_ranks,
)
from nan_hunter.training.events import RunEvent
from nan_hunter.training.forecast import Forecast, ForecastRule, RangeSampler, within
from nan_hunter.training.hook_failures import WatchFailed, script_entry
from nan_hunter.training.model_copy import (
    gather_full_state,
    replay_copy,
    sharded,
    unsharded_copy,
)
from nan_hunter.training.repro import ReproSource
from nan_hunter.training.rerun import (
    ModelCall,
    StepPrecision,
    pick_call,
    rerun_call,
)
from nan_hunter.training.step_verdict import Problem, Reason, step_verdict

MAX_CALLS = 64
"""Model calls kept per optimizer step (gradient accumulation); the oldest are dropped."""


class StopRun(SystemExit):
    """Ends the script from inside a hook (``--on-problem stop``, ``--max-steps``): a
    ``SystemExit``, so the script's ``except Exception`` does not swallow it and its
    ``finally`` blocks run. A script that swallows it all the same (a bare ``except:``) gets
    it again at its next backward and optimizer step (``ScriptWatch.stop``), and no update
    is applied after it."""


class ScriptWatch:
    """See the module docstring. ``on_problem(event)`` is called once per problem step that is
    re-run (at most ``max_reports``); ``steps`` counts the optimizer steps checked; after
    ``max_steps`` of them the script is ended with ``StopRun(0)``."""

    def __init__(
        self,
        settings: Settings,
        on_problem: Callable[[RunEvent], None],
        *,
        max_steps: int | None = None,
        skip_patience: int = 3,
        scale_floor: float = 1.0,
        max_reports: int = 1,
        precision_given: frozenset[str] = frozenset(),
        on_warning: Callable[[WatchWarning], None] | None = None,
        keep_repro: bool = False,
        spikes: SpikeRule | None = None,
        spikes_are_problems: bool = False,
        forecast: ForecastRule | None = None,
    ) -> None:
        self.settings = settings
        self.on_warning = on_warning
        self.warnings: list[WatchWarning] = []
        self._guards: dict[int, ClipGuard] = {}
        self.on_problem = on_problem
        self.max_steps = max_steps
        self.skip_patience = skip_patience
        self.scale_floor = scale_floor
        self.max_reports = max_reports
        self.precision_given = precision_given
        self.steps = 0
        """Optimizer steps checked."""
        self.problems = 0
        """Steps that tripped the check."""
        self.backwards = 0
        """Backward passes seen starting from a loss (one-element tensors)."""
        self.losses_checked = 0
        """Backward passes whose loss was checked after the backward, no torch optimizer
        having been seen (a script that updates its weights by hand)."""
        self._reported_at_backward = False
        self.stopping: int | None = None
        """The exit code of a ``StopRun`` raised: the stop holds until the script ends."""
        self.events: list[RunEvent] = []
        self.optimizers_seen = 0
        self._optimizers: dict[int, int] = {}
        """id -> 1-based order of first appearance."""
        self._calls: list[ModelCall] = []
        self._losses: list[torch.Tensor] = []
        self._local = threading.local()
        self._busy = False
        self._scales: dict[int, ScaleWatch] = {}
        self._in_scaler: Any = None
        """The GradScaler whose ``step`` is running (the optimizer pre-hook is inside it)."""
        self._scaler_optimizer: Any = None
        self._went_through = False
        """The optimizer pre-hook ran inside the running ``GradScaler.step`` (not skipped)."""
        self._iteration: list[tuple[OptimizerStep, Any]] = []
        """The ``scaler.step(optimizer)`` calls since the last ``scaler.update()``: several
        optimizers may share one GradScaler (a GAN)."""
        self._set_aside: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._pending: tuple[Problem, Any, float | None, int] | None = None
        self._ranks: Ranks | None = None
        self._handles: list[RemovableHandle] = []
        self._patches: list[SharedPatch] = []
        self.failure: WatchFailed | None = None
        """Set when a hook of ours failed: the watch is detached and the script ended."""
        self.keep_repro = keep_repro
        """Keep each call's RNG states and hand ``on_problem`` a ``ReproSource`` (--save-repro)."""
        self.spikes = SpikeWatch(spikes) if spikes is not None else None
        """The spike rule on each optimizer step's loss; None: off."""
        self._spike_watches: dict[int, SpikeWatch] = {}
        """Each optimizer's running median of its losses (by id)."""
        self.spikes_are_problems = spikes_are_problems
        self.spikes_seen: list[int] = []
        """The steps whose loss was a spike (warned about once, at the first)."""
        self.forecast_rule = forecast if forecast is not None and forecast.every > 0 else None
        fmt = format_for(settings.dtype)
        self._sampler = RangeSampler(fmt.smallest_normal)
        self.forecast = Forecast(fmt.max, fmt.name)
        """The sampled range map and its trend (``training.forecast``)."""
        self.forecasts_said: list[str] = []
        """The modules whose forecast overflow was warned about (once each)."""
        self._update_snapshot: UpdateSnapshot | None = None
        self.lost_updates: LostUpdates | None = None
        """The first sampled update that low-precision weights mostly lost (warned once)."""

    # ------------------------------------------------------------------ install / remove

    def __enter__(self) -> ScriptWatch:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def install(self) -> None:
        script_patches.activate(self)
        nn_hooks = torch.nn.modules.module
        self._handles = [
            nn_hooks.register_module_forward_pre_hook(self._pre_forward),
            nn_hooks.register_module_forward_hook(
                self._post_forward, with_kwargs=True, always_call=True
            ),
            register_optimizer_step_pre_hook(self._before_update),
            register_optimizer_step_post_hook(self._after_update),
        ]
        self._patches = list(script_patches.PATCHES)
        for patch in self._patches:
            patch.acquire()

    def close(self) -> None:
        handles, self._handles = self._handles, []
        patches, self._patches = self._patches, []
        guards, self._guards = self._guards, {}
        try:
            for handle in handles:
                handle.remove()
        finally:
            self._sampler.detach()
            for guard in guards.values():
                guard.remove()
            for patch in patches:
                patch.release()
            script_patches.deactivate(self)
            self._calls, self._losses = [], []

    def detach_after(self, hook: str, exc: Exception) -> WatchFailed:
        """A hook of ours raised ``exc``: the watch leaves the script as it found it (the
        gradients set aside put back) and the ``WatchFailed`` to end the script with."""
        self.failure = WatchFailed(hook, self.steps + 1, InternalError(exc))
        try:
            self._restore_grads()
        finally:
            self.close()
        return self.failure

    # ------------------------------------------------------------------ what the hooks see

    @script_entry("the module forward pre-hook")
    def _pre_forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth or self._busy or not torch.is_grad_enabled():
            return
        if not any(p.requires_grad for p in module.parameters()):
            return  # a loss module, an activation called on its own
        # the generators' state, for a re-run with the same dropout masks (a copy of ~5 KB)
        self._local.pending = (module, StepPrecision.now(module, args), rng_state())
        rule = self.forecast_rule
        if (rule is not None and self.optimizers_seen and self.steps % rule.every == 0
                and not self._sampler.pending):
            self._sampler.attach(module)  # this step's first model call: sampled

    @script_entry("the module forward hook")
    def _post_forward(self, module: torch.nn.Module, args: tuple[Any, ...], *rest: Any) -> None:
        # (kwargs, output); after a forward that raised, torch passes (output=None) only
        kwargs, output = rest if len(rest) == 2 else ({}, None)
        depth = getattr(self._local, "depth", 1) - 1
        self._local.depth = depth
        pending = getattr(self._local, "pending", None)
        if depth or pending is None or pending[0] is not module:
            return
        self._local.pending = None
        self._sampler.detach()  # the backward's hooks are on the outputs: the rest not sampled
        if output is None:
            return  # the forward raised (always_call)
        call = ModelCall(module, args, dict(kwargs), pending[1], rng=pending[2],
                         versions=input_versions(args, kwargs))
        call.watch_outputs(output)
        if call.outputs:
            self._calls.append(call)
            del self._calls[:-MAX_CALLS]

    @staticmethod
    def torch_replaced() -> tuple[str, ...]:
        """torch's functions the script replaced (``torch_originals.replaced``): the watch's
        checks never call them, but the script's own code did."""
        return real.replaced()

    @property
    def losses_only(self) -> int:
        """The losses checked after their backward in a run that never stepped a torch
        optimizer (0 once one stepped: its steps are what was checked)."""
        return 0 if self.optimizers_seen else self.losses_checked

    def stop(self, code: int) -> None:
        """End the script with ``StopRun(code)``, now and at every later backward and optimizer
        step the script reaches after swallowing it."""
        self.stopping = code
        raise StopRun(code)

    @script_entry("the backward replacement")
    def saw_backward(self, tensors: Any) -> None:
        """A backward starts from ``tensors`` (a tensor or a sequence, as
        ``torch.autograd.backward`` takes them): the one-element ones are losses."""
        if self.stopping is not None:
            raise StopRun(self.stopping)
        if self._busy:
            return
        if isinstance(tensors, torch.Tensor):
            tensors = (tensors,)
        elif not isinstance(tensors, (tuple, list)):
            return  # gradient edges: not a loss
        losses = [t for t in tensors if isinstance(t, torch.Tensor) and t.numel() == 1]
        if losses:
            self.backwards += 1
            self._losses += losses
            del self._losses[:-MAX_CALLS]

    @script_entry("the backward replacement")
    def backward_done(self) -> None:
        """A backward from a loss has run. While no torch optimizer has been seen, its loss is
        checked here: a script that updates its weights by hand has no other step boundary."""
        if self._busy or self.optimizers_seen or not self._losses:
            return
        flags = self._loss_flags()
        finite = bool(torch.stack([f.to(flags[0].device) for f in flags]).all())
        bad = None if finite else self._first_bad_loss()
        self._losses = []
        self.losses_checked += 1
        if bad is None:
            return
        problem = step_verdict(
            loss=bad, loss_ok=False, grads_ok=True, scaled=False, scale_problem=None,
            bad_grads=lambda: "",
        )
        assert problem is not None
        self._reported_at_backward = True  # an optimizer step after it skips, not re-reports
        self._problem(problem, None, None, step=self.backwards)

    # ------------------------------------------------------------------ step boundaries

    def _params(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def _loss_flags(self) -> list[torch.Tensor]:
        return [real.isfinite(loss.detach()).all() for loss in self._losses]

    @script_entry("the optimizer step pre-hook")
    def _before_update(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if self.stopping is not None:  # the script swallowed the stop: no update after it
            raise StopRun(self.stopping)
        if self._busy:
            return None
        self._saw_optimizer(optimizer)
        if self._in_scaler is not None:
            self._went_through = True
        # optimizer.step(closure) (Lightning, LBFGS): the forward and backward run inside the
        # step, after this hook: check after the closure, before the update
        if callable(kwargs.get("closure")):
            kwargs = {**kwargs, "closure": _CheckedClosure(self, optimizer, kwargs["closure"])}
            return args, kwargs
        if args and callable(args[0]):
            return (_CheckedClosure(self, optimizer, args[0]), *args[1:]), kwargs
        self.check(optimizer)
        return None

    @script_entry("the step check")
    def check(self, optimizer: torch.optim.Optimizer) -> None:
        """The step check, between the backward and the update."""
        scaler = self._in_scaler
        flags = self._loss_flags()
        grad_flag = None if scaler is not None else grads_finite_flag(self._params(optimizer))
        if grad_flag is not None:
            flags.append(grad_flag.to(flags[0].device) if flags else grad_flag)
        loss_value = self._spike_value(scaler)
        if loss_value is not None:  # read in the same host sync as the flags
            flags.append(loss_value)
        read = (
            torch.stack([f.to(flags[0].device, torch.float32) for f in flags]).tolist()
            if flags else []
        )
        loss_read = read.pop() if loss_value is not None else None
        values = [bool(v) for v in read]
        losses_ok = all(values[: len(self._losses)])
        grads_ok = values[-1] if grad_flag is not None else True
        scale = float(scaler.get_scale()) if scaler is not None and not losses_ok else None
        problem = step_verdict(
            loss=None if losses_ok else self._first_bad_loss(), loss_ok=losses_ok,
            grads_ok=grads_ok,
            scaled=scaler is not None, scale_problem=None,
            bad_grads=lambda: bad_optimizer_grads(optimizer),
        )
        if loss_read is not None and problem is None:
            problem = self._spike(loss_read, optimizer=optimizer)
        forecast = self._sampled(self.steps + 1)
        if problem is None:
            problem = forecast
        if problem is not None:
            self._losses = []  # checked: the GradScaler's update does not count them again
            self._set_grads_aside(optimizer)  # this update is skipped (restored after it)
        elif (self.forecast_rule is not None and self.lost_updates is None
              and self.steps % self.forecast_rule.every == 0):
            # on a sampled step: are the low-precision weights' updates lost to rounding?
            self._update_snapshot = UpdateSnapshot.take(self._params(optimizer))
        if self._reported_at_backward:  # this step's loss was reported after its backward
            self._reported_at_backward = False
            return
        if scaler is not None and self._current_ranks() is not None:
            # under torchrun the ranks agree in scaler.update(), which every rank reaches
            self._pending = (
                (problem, optimizer, scale, self.steps + 1) if problem is not None else None
            )
            return
        problem, rerun = self._agree(problem)
        if problem is not None:
            try:
                self._problem(problem, optimizer, scale, rerun)
            except BaseException:
                self._restore_grads()
                raise

    @script_entry("the optimizer step post-hook")
    def _after_update(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._busy:
            return
        self._restore_grads()
        snapshot, self._update_snapshot = self._update_snapshot, None
        if snapshot is not None:
            self._check_updates(snapshot)
        if self._in_scaler is None:  # with a GradScaler, scaler.step counts it
            self.steps += 1
            self._step_done()

    def _saw_optimizer(self, optimizer: Any) -> None:
        if id(optimizer) not in self._optimizers:
            self.optimizers_seen += 1
            self._optimizers[id(optimizer)] = self.optimizers_seen

    @script_entry("GradScaler.step")
    def scaler_step(self, scaler: Any, optimizer: Any) -> None:
        """GradScaler.step is about to run: the optimizer pre-hook is inside it."""
        key = id(scaler)
        if key not in self._scales:
            self._scales[key] = ScaleWatch.start(scaler, self.skip_patience, self.scale_floor)
        if id(optimizer) not in self._guards and hasattr(optimizer, "param_groups"):
            guard = ClipGuard(
                self._params(optimizer), lambda: gradients_scaled(scaler, optimizer),
                lambda name, where: self._clipped_scaled(name, where, scaler),
            )
            guard.install()
            self._guards[id(optimizer)] = guard
        if hasattr(optimizer, "param_groups"):
            self._saw_optimizer(optimizer)
        self._in_scaler = scaler
        self._scaler_optimizer = optimizer
        self._went_through = False

    @script_entry("the clipping guard")
    def _clipped_scaled(self, name: str, where: str, scaler: Any) -> None:
        if self.warnings:
            return  # reported once
        at = f" at {where}" if where else ""
        warning = WatchWarning(
            code="clip_before_unscale", step=self.steps + 1, where=where,
            message=(
                f"{name} was called{at} on scaled gradients (before scaler.unscale_(optimizer)):"
                f" its threshold applies to gradients multiplied by the loss scale "
                f"({float(scaler.get_scale()):g})"
            ),
            fix=FIX,
        )
        self.warnings.append(warning)
        if self.on_warning is not None:
            self.on_warning(warning)

    @script_entry("GradScaler.step")
    def scaler_step_done(self, completed: bool) -> None:
        """``GradScaler.step`` returned (``completed``) or raised: a step that returned is one
        optimizer step, skipped when the optimizer's own step did not run."""
        scaler, self._in_scaler = self._in_scaler, None
        if self._busy or not completed or self.stopping is not None:
            return
        optimizer = self._scaler_optimizer
        self.steps += 1
        step = OptimizerStep(id(optimizer), not self._went_through, self.steps)
        self._iteration.append((step, optimizer))
        losses, self._losses = self._losses, []  # this optimizer step's: checked below or before
        if not step.skipped or not losses:
            return
        # skipped: the optimizer pre-hook did not run, so its losses (and the spike rule's
        # value) are read here, in one host sync on a skipped step only; another optimizer's
        # step (a GAN's) does not see them
        self._losses = losses
        try:
            flags = [f.float() for f in self._loss_flags()]
            loss_value = self._spike_value(scaler)
            read = torch.stack(
                [*flags, *([loss_value.to(flags[0].device)] if loss_value is not None else [])]
            ).tolist()
            loss_read = read.pop() if loss_value is not None else None
            bad = None if all(read) else self._first_bad_loss()
        finally:
            self._losses = []
        if bad is not None:
            problem = step_verdict(
                loss=bad, loss_ok=False, grads_ok=True, scaled=True, scale_problem=None,
                bad_grads=lambda: "",
            )
        else:
            problem = (self._spike(loss_read, step.number, optimizer) if loss_read is not None
                       else None)
        if problem is None:
            return
        scale = float(scaler.get_scale())  # the one this step ran with (before update())
        if self._current_ranks() is not None:  # the ranks agree in scaler.update()
            if self._pending is None:
                self._pending = (problem, optimizer, scale, step.number)
            return
        self._problem(problem, optimizer, scale, step=step.number)

    @script_entry("GradScaler.update")
    def scaler_updated(self, scaler: Any) -> None:
        if self._busy:
            return
        watch = self._scales.get(id(scaler))
        if watch is None:  # update() without step(): nothing to check
            return
        iteration, self._iteration = self._iteration, []
        several = len(self._optimizers) > 1
        steps = [
            dataclasses.replace(step, label=self._label(optimizer)) if several else step
            for step, optimizer in iteration
        ]
        used, skipped, scale_problem = watch.observe(float(scaler.get_scale()), steps)
        losses_ok, loss_read = True, None
        if skipped and self._losses:  # the optimizer pre-hook did not run: check the loss here
            flags = [f.float() for f in self._loss_flags()]
            loss_value = self._spike_value(None)  # scaled: divided by the scale used, below
            read = torch.stack(
                [*flags, *([loss_value.to(flags[0].device)] if loss_value is not None else [])]
            ).tolist()
            loss_read = read.pop() / (used or 1.0) if loss_value is not None else None
            losses_ok = all(read)
        problem = step_verdict(
            loss=None if losses_ok else self._first_bad_loss(), loss_ok=losses_ok,
            grads_ok=True, scaled=True,
            scale_problem=scale_problem, bad_grads=lambda: "",
        )
        if loss_read is not None and problem is None:
            problem = self._spike(loss_read, optimizer=iteration[-1][1] if iteration else None)
        # the step it is about: the skipped one whose streak tripped, the first skipped one
        # (its loss), else the last of this update
        about = watch.tripped if scale_problem is not None else None
        about = about or next((s for s in steps if s.skipped), steps[-1] if steps else None)
        optimizer = next((o for s, (_, o) in zip(steps, iteration, strict=True) if s is about),
                         self._scaler_optimizer)
        step = about.number if about is not None else self.steps + 1
        scale = used
        pending, self._pending = self._pending, None
        if pending is not None:  # the pre-hook's verdict, held for the ranks' agreement
            problem, optimizer, scale, step = pending
        if not iteration:
            self.steps += 1  # an update with no step seen: one step, as before
        problem, rerun = self._agree(problem)
        if problem is not None:
            self._problem(problem, optimizer, scale, rerun, step=step)
        self._step_done()

    def _label(self, optimizer: Any) -> str:
        """``optimizer 2 (Adam)``: which of several optimizers, in the order they first
        stepped."""
        return f"optimizer {self._optimizers.get(id(optimizer), 0)} ({type(optimizer).__name__})"

    def _current_ranks(self) -> Ranks | None:
        """``current_ranks()``, kept once found while the process group lives (it is asked
        once or twice a step)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            self._ranks = None
        elif self._ranks is None:
            self._ranks = current_ranks()
        return self._ranks

    def _agree(self, problem: Problem | None) -> tuple[Problem | None, bool]:
        """Under torchrun, every rank's verdict (one all-reduce, at the same call on every
        rank): a problem on any rank is a problem on all, so all stop together. Returns this
        rank's problem and whether it re-runs its step (the first rank whose own loss broke;
        without one, every rank)."""
        ranks = self._current_ranks()
        if ranks is None:
            return problem, True
        code = OK if problem is None else OWN if problem.own_batch else SEEN
        codes = agree(ranks, code)
        if not any(codes):
            return None, False
        if problem is None:
            others = ", ".join(str(r) for r, c in enumerate(codes) if c)
            problem = Problem(Reason.OTHER_RANK, f"rank {others} saw a problem at this step")
        return problem, ranks.rank in scanning_ranks(codes)

    def _spike_value(self, scaler: Any) -> torch.Tensor | None:
        """The step's loss as a tensor for the spike rule, unscaled (no host sync)."""
        if self.spikes is None or not self._losses:
            return None
        losses = self._losses
        device = losses[0].device
        total = torch.stack([loss.detach().to(device, torch.float32).reshape(())
                             for loss in losses]).sum()
        scale = getattr(scaler, "_scale", None) if scaler is not None else None
        if scale is not None and scaler.is_enabled():  # the backward started from scaled losses
            total = total / scale.to(device, torch.float32)
        return total

    def _spike(
        self, loss: float, step: int | None = None, optimizer: Any = None
    ) -> Problem | None:
        """The spike rule on the step's loss (``step``: its number, when it is not the next
        one): a warning, or a problem step with ``spikes_are_problems``. Each optimizer's
        losses have their own running median: a GAN's generator and discriminator losses live
        on different scales."""
        assert self.spikes is not None
        watch = self._spike_watches.get(id(optimizer))
        if watch is None:
            watch = self._spike_watches[id(optimizer)] = SpikeWatch(self.spikes.rule)
        spike = watch.observe(self.steps + 1 if step is None else step, loss)
        if spike is None:
            return None
        line = spike.line()
        if len(self._optimizers) > 1 and optimizer is not None:
            line = f"{self._label(optimizer)}: {line}"
        if self.spikes_are_problems:
            return Problem(Reason.SPIKE, line)
        self.spikes_seen.append(spike.step)
        if self.on_warning is not None and len(self.spikes_seen) == 1:
            # one line: a loss that keeps rising trips the rule step after step; the summary
            # counts the others
            self.on_warning(WatchWarning(code="loss_spike", step=spike.step,
                                         message=line, fix=""))
        return None

    def _check_updates(self, snapshot: UpdateSnapshot) -> None:
        """The sampled update of low-precision weights: a warning, once, when most of it was
        lost to rounding (``precision.lost_updates``)."""
        lost = snapshot.compare(self.steps + 1)
        if lost is None or lost.share < LOST_SHARE:
            return
        self.lost_updates = lost
        if self.on_warning is not None:
            self.on_warning(WatchWarning(code="lost_updates", step=lost.step,
                                         message=lost.line(), fix=LOST_FIX))

    def forecast_fields(self) -> dict[str, Any]:
        """``TrainingSteps``'s forecast fields: the trends so far, the steps sampled."""
        return {"forecast": tuple(self.forecast.trends()), "samples": self.forecast.samples}

    def _sampled(self, step: int) -> Problem | None:
        """The sampled step's range map into the forecast (one host sync, on a sampled step
        only): the first time a module is forecast to overflow within the run, a warning; with
        ``stop_before``, an overflow forecast before the next sample is a problem step."""
        if not self._sampler.pending:
            return None
        sample = self._sampler.collect(step)
        rule = self.forecast_rule
        if sample is None or rule is None:
            return None
        self.forecast.add(sample)
        trends = self.forecast.trends()
        if rule.stop_before and trends and trends[0].overflow_step is not None and (
            trends[0].overflow_step <= step + rule.every
        ):
            return Problem(Reason.FORECAST, trends[0].line())
        # one line for the module forecast to overflow first, and again only when another
        # module takes its place (the others are in the summary and the report)
        first = trends[0] if trends else None
        if (first is not None and first.module not in self.forecasts_said
                and within(first, step, self.max_steps)):
            self.forecasts_said.append(first.module)
            if self.on_warning is not None:
                self.on_warning(WatchWarning(code="overflow_forecast", step=step,
                                             message=first.line(), fix=""))
        return None

    def _first_bad_loss(self) -> torch.Tensor | None:
        for loss in self._losses:
            if not bool(real.isfinite(loss.detach()).all()):
                return loss
        return self._losses[-1] if self._losses else None

    def _step_done(self) -> None:
        """The step (or, with a GradScaler, the ``update()`` ending the optimizer steps
        counted) is over."""
        self._calls, self._losses = [], []
        if self._sampler.pending:  # a step the check did not see (skipped by the GradScaler)
            self._sampled(self.steps)
        if self.max_steps is not None and self.steps >= self.max_steps:
            raise StopRun(0)

    # ------------------------------------------------------------------ a problem step

    def _set_grads_aside(self, optimizer: torch.optim.Optimizer) -> None:
        for p in self._params(optimizer):
            self._set_aside.append((p, p.grad))
            p.grad = None

    def _restore_grads(self) -> None:
        aside, self._set_aside = self._set_aside, []
        for p, grad in aside:
            p.grad = grad

    def _problem(
        self, problem: Problem, optimizer: Any, scale: float | None, rerun: bool = True,
        step: int | None = None,
    ) -> None:
        """``step``: the problem step's number when it is not the next optimizer step (a
        backward without an optimizer: that backward's count)."""
        self.problems += 1
        call = self._pick_call(optimizer)
        gathered = self._gather_sharded(call)  # on every rank, or on none
        if len(self.events) >= self.max_reports:
            return
        step = self.steps + 1 if step is None else step
        report, why_not, model, repro = None, "", "", None
        if not rerun:
            why_not = "another rank re-runs its step"
        elif call is None:
            why_not = "no call of a model with trainable parameters was seen in this step"
        elif isinstance(gathered, str):
            why_not = gathered
        else:
            module, _ = unwrap_model(call.module)
            if self.keep_repro and gathered is None:
                repro = ReproSource.of(step, module, call, scale, self.settings,
                                       self.precision_given)
            self._busy = True
            try:
                report, model = self._rerun(call, module, gathered, scale, problem)
                before = min(self.steps, step - 1)  # the clean steps before it
                checked = (
                    f"{before} optimizer step{'s' * (before != 1)}"
                    if self.optimizers_seen else
                    f"no torch optimizer seen, the loss of {self.losses_checked - 1} backward "
                    f"pass{'es' * (self.losses_checked != 2)}"
                )
                note = (f"training step {step}: {problem.detail}; {checked} checked before it; "
                        "re-run from the step's own inputs and weights")
                assert report.training is not None
                verdict = report.training
                notes = (*report.target.notes, note,
                         f"verdict: {verdict.verdict.label if verdict.verdict else '?'}: "
                         + "; ".join(verdict.evidence))
                report = dataclasses.replace(
                    report,
                    target=dataclasses.replace(report.target, notes=notes),
                    training=dataclasses.replace(
                        verdict, steps_checked=before, problem_step=step,
                        losses_checked=self.losses_only, **self.forecast_fields(),
                    ),
                )
            except NanHunterError as exc:
                why_not = f"the re-run failed: {first_line(exc)}"
            except Exception as exc:  # a model that cannot be copied, or an error of ours
                why_not = f"the re-run failed: {type(exc).__name__}: {first_line(exc)}"
            finally:
                self._busy = False
        event = RunEvent(step, problem.reason, problem.detail, report, model, why_not, scale,
                         repro=repro)
        if report is not None:  # a failed re-run does not use up max_reports
            self.events.append(event)
        try:
            self.on_problem(event)
        except BaseException:  # the script ends here: the steps checked are those before it
            self.steps = min(self.steps, step - 1) if self.optimizers_seen else self.steps
            raise

    def _rerun(
        self, call: ModelCall, module: torch.nn.Module,
        gathered: dict[str, torch.Tensor] | None, scale: float | None, problem: Problem,
    ) -> tuple[Report, str]:
        """Re-run the call in the precision it ran in; when that finds no error, once more
        from the random number generators' state of the step's forward. The report (of the
        re-run that reproduced it, else the first) carries the verdict on the cause in its
        ``training`` (``diagnosis.diagnose``), and the re-run model's class name."""
        seen = StepSeen.of(call, problem)
        inputs_changed = changed_inputs(call)

        def copy() -> torch.nn.Module:
            return replay_copy(module) if gathered is None else unsharded_copy(module, gathered)

        replay = copy()
        model = type(replay).__name__
        state = plain_state(replay)
        report = rerun_call(call, replay, self.settings, scale=scale,
                            precision_given=self.precision_given)
        changed = changed_state(state, plain_state(replay))
        runs, rng_restored, with_rng = 1, False, False
        if not report.errors:  # once more, with the dropout masks of the step's forward
            runs, rng_restored = 2, call.rng is not None
            again = rerun_call(call, copy(), self.settings, scale=scale,
                               precision_given=self.precision_given, step_rng=True)
            if again.errors:
                report, with_rng = again, rng_restored
        repeats = Repeats(model, runs, rng_restored, with_rng, changed, inputs_changed)
        verdict, evidence = diagnose(report, seen, repeats)
        return dataclasses.replace(
            report, training=TrainingSteps(0, verdict=verdict, evidence=evidence)
        ), model

    def _gather_sharded(self, call: ModelCall | None) -> dict[str, torch.Tensor] | str | None:
        """FSDP: ``gather_full_state`` of the step's model, at the first ``max_reports`` problem
        steps (a count every rank shares, so all ranks gather or none does)."""
        module = unwrap_model(call.module)[0] if call is not None else None
        if self.problems > self.max_reports:
            if module is not None and sharded(module):
                return ("FSDP shards the model's parameters, and its full state is gathered at "
                        "the first max_reports problem steps only")
            return None
        return gather_full_state(module, self._current_ranks())

    def _pick_call(self, optimizer: Any) -> ModelCall | None:
        """The step's model call: of a module whose parameters the optimizer updates, the
        first whose output or output gradient is not finite, else the last."""
        calls = self._calls
        if optimizer is not None:
            mine = {id(p) for p in self._params(optimizer)}
            calls = [c for c in calls if any(id(p) in mine for p in c.module.parameters())]
        return pick_call(calls)


class _CheckedClosure:
    """An optimizer's closure that, once it has run (forward and backward), checks the step."""

    def __init__(self, watch: ScriptWatch, optimizer: Any, closure: Callable[..., Any]) -> None:
        self.watch, self.optimizer, self.closure = watch, optimizer, closure

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.closure(*args, **kwargs)
        self.watch.check(self.optimizer)
        return result
