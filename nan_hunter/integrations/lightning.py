"""``NanHunterCallback`` for PyTorch Lightning::

    from nan_hunter.integrations.lightning import NanHunterCallback

    trainer = pl.Trainer(callbacks=[NanHunterCallback()])

At ``on_fit_start`` it starts a ``watch`` on the LightningModule, the Trainer's optimizer and
(with 16-mixed precision) its GradScaler. Before the first training step runs
(``on_train_batch_start`` of step 0, when the first batch exists) it scans that batch as it will
run under CUDA FP16 autocast (emulated on the CPU). After each training batch
(``on_train_batch_end``) the watcher checks the loss ``training_step`` returned and the
gradients; on a problem it re-runs ``training_step`` on a copy of the module (the copy's forward
is ``training_step``, so module paths stay the module's own). ``on_problem``: ``"stop"``
(default) sets ``trainer.should_stop``, ``"raise"`` raises ``TrainingProblem``, ``"report"``
records. Reports (text + JSON) go to ``output_dir`` (default: ``trainer.default_root_dir``):
``nan_hunter_preflight.*``, ``nan_hunter_step{N}.*`` (N from 1, as trainers count steps),
``.rank{r}`` per rank under DDP, where
every rank stops at the same step (the watcher's agreement).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl  # type: ignore[no-redef]

from nan_hunter.findings import Report
from nan_hunter.integrations._common import (
    log_summary,
    preflight_outcome,
    preflight_scan,
    record_step_event,
)
from nan_hunter.training.distributed import ReportTo
from nan_hunter.training.events import OnProblem, TrainingProblem, WatchEvent
from nan_hunter.training.watcher import Watcher

__all__ = ["NanHunterCallback", "as_training_step"]


def step_loss(output: Any) -> torch.Tensor | None:
    """The loss ``training_step`` returned: a tensor, or ``{"loss": tensor, ...}``."""
    if isinstance(output, dict):
        output = output.get("loss")
    return output if isinstance(output, torch.Tensor) else None


def as_training_step(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` (a copy of a LightningModule) called on a batch runs its ``training_step``
    and returns the loss; the calls ``training_step`` itself makes (``self(x)``) reach the
    module's own forward. The copy is detached from the Trainer (Lightning drops it when
    copying). Both methods are looked up on the module's class at each call, through an object
    that a deep copy of the module copies along: the copy that verifies a fix, whose class is
    the patched one, runs the patched code (a closure kept the original module and methods,
    so every Lightning fix was refuted by the unpatched code)."""
    module.forward = _TrainingStepForward(module)  # type: ignore[method-assign]
    return module


class _TrainingStepForward:
    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.inside = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        if self.inside:
            return type(module).forward(module, *args, **kwargs)
        self.inside = True
        try:
            with warnings.catch_warnings():  # self.log() on a copy without a Trainer
                warnings.filterwarnings("ignore", message=r".*self\.log\(\)")
                loss = step_loss(type(module).training_step(module, args[0], 0))
        finally:
            self.inside = False
        if loss is None:
            raise TypeError("training_step returned no loss")
        return loss


def _returned_loss(output: Any, batch: Any) -> torch.Tensor:
    return output


class NanHunterCallback(pl.Callback):
    """See the module docstring. Attributes: ``events``, ``preflight`` (the pre-flight
    ``Report``), ``watcher``, ``report_files``."""

    def __init__(
        self,
        *,
        on_problem: OnProblem = "stop",
        preflight: bool = True,
        report_to: ReportTo = "rank0",
        max_reports: int = 1,
        output_dir: str | Path | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.on_problem: OnProblem = on_problem
        self.run_preflight = preflight
        self.report_to: ReportTo = report_to
        self.max_reports = max_reports
        self.output_dir = output_dir
        self.options = options
        self.watcher: Watcher | None = None
        self.preflight: Report | None = None
        self.events: list[WatchEvent] = []
        self.report_files: list[Path] = []
        Watcher(torch.nn.Module(), on_problem=on_problem, report_to=report_to,
                max_reports=max_reports, **options)  # a bad option fails here, not at fit time

    def _folder(self, trainer: Any) -> Path:
        return Path(self.output_dir if self.output_dir is not None else trainer.default_root_dir)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._close()
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        self.watcher = Watcher(
            pl_module, optimizer, scaler, loss_fn=_returned_loss, on_problem=self.on_problem,
            report_to=self.report_to, max_reports=self.max_reports, rerun_as=as_training_step,
            **self.options,
        ).__enter__()
        self.watcher.announce = False  # record_step_event logs, with the report's file

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.run_preflight or self.preflight is not None or trainer.global_step != 0:
            return
        report = preflight_scan(pl_module, (batch,), _returned_loss, self.options,
                                rerun_as=as_training_step)
        self.preflight = report
        folder = self._folder(trainer)
        if preflight_outcome(report, folder, self.events, self.report_files, self.on_problem):
            trainer.should_stop = True

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        # Lightning's optimizer computes the gradients inside step(closure), after the step
        # pre-hook ran: check them here, between the backward and the update
        if self.watcher is not None:
            self.watcher.before_update()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.watcher is None:
            return
        kept = len(self.watcher.reports)
        try:
            event = self.watcher.step((batch,), step_loss(outputs))
        except TrainingProblem as problem:
            self._record(trainer, problem.event, kept)
            raise
        if event is not None:
            self._record(trainer, event, kept)
            if self.watcher.stopped:
                trainer.should_stop = True

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        log_summary(self.watcher)
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    def _record(self, trainer: Any, event: WatchEvent, kept: int) -> None:
        new_report = self.watcher is not None and len(self.watcher.reports) > kept
        record_step_event(
            event, new_report, self._folder(trainer), self.events, self.report_files
        )

    def _close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
