"""The re-run of a step that ``watch`` found broken: on which module, from what inputs, with
which loss and precision.

A ``StepRerun`` is configured once per ``Watcher`` (the plain module, the scan settings,
``loss_fn``, ``rerun_as``, ``unsharded``) and ``run`` re-runs one problem step through the scan
engine (``nan_hunter.api.scan``): on the copy the optimizer pre-hook made before the update, or
a fresh deep copy, or, for an FSDP module given ``unsharded``, a plain model loaded with the
gathered full state dict. With the model's real call of the step (``with watch``), the inputs,
the precision and the backward's seed come from that call (``training.rerun``); without it,
from the ``batch`` given to ``w.step``. Every way it cannot run is a ``Rerun`` with
``why_not``, never an exception: a failed re-run must not end the user's training loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from nan_hunter.core.batch import Batch, LossFn
from nan_hunter.errors import NanHunterError, first_line
from nan_hunter.findings import Report
from nan_hunter.project.config import Settings
from nan_hunter.project.options import explicitly_set
from nan_hunter.training.checks import finite_flag, params_finite
from nan_hunter.training.model_copy import full_state, replay_copy, sharded
from nan_hunter.training.rerun import (
    ModelCall,
    OutputGradientLoss,
    pick_call,
    precision_settings,
)


@dataclass(frozen=True)
class Rerun:
    """A re-run's outcome: its report, or why there is none."""

    report: Report | None
    why_not: str | None
    pre_step: bool
    """The weights re-run are those the step's forward used (copied before the update, or the
    update was skipped)."""


@dataclass(frozen=True)
class StepRerun:
    """See the module docstring."""

    module: torch.nn.Module
    """The plain module behind the watched model: the one copied and scanned."""
    settings: Settings
    loss_fn: LossFn | None = None
    rerun_as: Callable[[torch.nn.Module], torch.nn.Module] | None = None
    """Turns the copy of the model into the module the re-run scans (the Lightning callback
    makes its forward run ``training_step``); None: the copy itself."""
    unsharded: Callable[[], torch.nn.Module] | None = None
    """FSDP: builds an unsharded module of the same architecture, loaded with the gathered
    full state dict."""

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """FSDP with ``unsharded``: the full state dict (a collective: called on every rank at
        the same agreed problem step, or on none); None otherwise."""
        if self.unsharded is None or not sharded(self.module):
            return None
        return full_state(self.module)

    def run(
        self,
        batch: Any,
        calls: list[ModelCall],
        scale: float | None,
        snapshot: torch.nn.Module | None,
        skipped: bool,
        full_state: dict[str, torch.Tensor] | None = None,
    ) -> Rerun:
        """Re-run the step: ``snapshot`` is the copy made before the update (None: none was
        made), ``skipped`` that GradScaler skipped the update, ``scale`` the loss scale the step
        ran with, ``full_state`` what ``full_state()`` gathered."""
        pre_step = snapshot is not None or skipped
        if batch is None and not calls:
            return Rerun(None, "w.step() was given no batch", pre_step)
        if sharded(self.module):
            return self._run_sharded(batch, calls, scale, full_state)
        if not pre_step and not params_finite(self.module):
            return Rerun(
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
                return Rerun(None, f"the model cannot be deep-copied: {first_line(exc)}", pre_step)
        return self._scan_replay(replay, batch, calls, scale, pre_step)

    def _run_sharded(
        self, batch: Any, calls: list[ModelCall], scale: float | None,
        full_state: dict[str, torch.Tensor] | None,
    ) -> Rerun:
        if self.unsharded is None or full_state is None:
            return Rerun(
                None,
                "FSDP shards the module's parameters: a copy could only run with collectives; "
                "pass unsharded=<a function building the plain model> to watch()",
                False,
            )
        try:
            fresh = self.unsharded()
            fresh.load_state_dict(full_state)
        except Exception as exc:
            return Rerun(
                None, f"unsharded() did not take the gathered state: {first_line(exc)}", False
            )
        flag = finite_flag(full_state.values())
        if flag is not None and not bool(flag):
            return Rerun(
                None,
                "the optimizer already wrote non-finite values into the weights; with FSDP call "
                "w.step() after the backward and before optimizer.step()",
                False,
            )
        fresh.train(self.module.training)
        return self._scan_replay(fresh, batch, calls, scale, False)

    def _scan_replay(
        self, replay: torch.nn.Module, batch: Any, calls: list[ModelCall], scale: float | None,
        pre_step: bool,
    ) -> Rerun:
        try:
            if self.rerun_as is not None:
                replay = self.rerun_as(replay)
            return Rerun(self._scan(replay, batch, calls, scale), None, pre_step)
        except NanHunterError as exc:
            return Rerun(None, f"the re-run failed: {exc}", pre_step)

    def _scan(
        self, replay: torch.nn.Module, batch: Any, calls: list[ModelCall], scale: float | None
    ) -> Report:
        """The scan models the loss scale the step ran with: the GradScaler's current scale,
        or no scaling without one, unless ``grad_scale`` was set explicitly. With the model's
        real call of this step (``with watch``), the re-run takes its inputs from that call, its
        precision from how the call ran when it ran in FP16/BF16 (unless ``dtype``/``mode`` were
        set), and, without a ``loss_fn``, its backward from the real gradient at the model's
        outputs."""
        from nan_hunter.api import scan

        settings = self.settings
        if not explicitly_set(settings, "grad_scale"):
            settings = dataclasses.replace(settings, grad_scale=scale)
        call = pick_call(calls)
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
        return scan(replay, Batch(call.args, call.kwargs, raw), loss_fn, settings=settings)
