"""``NanHunterCallback`` for the Hugging Face ``Trainer``::

    from nan_hunter.integrations.transformers import NanHunterCallback

    trainer = Trainer(model, args, train_dataset=..., callbacks=[NanHunterCallback()])

At ``on_train_begin`` it scans the first training batch as it will run under CUDA FP16
autocast (emulated on the CPU: a run about to be launched on GPUs is checked first) and starts a
``watch`` on the Trainer's model, its accelerate-wrapped optimizer and GradScaler. Forward hooks
on the model keep each training micro-batch and the loss the model returned; after each
optimizer step (``on_optimizer_step``, before the Trainer zeroes the gradients) the watcher
checks the step and, on a problem, re-runs the micro-batch that broke on a copy of the model.
Reports (text + JSON) go to ``args.output_dir`` (``nan_hunter_preflight.*``,
``nan_hunter_step{N}.*``, N from 1 as trainers count steps; ``.rank{r}`` under
torch.distributed). ``on_problem``: ``"stop"``
(default) sets ``control.should_training_stop``, ``"raise"`` raises ``TrainingProblem``,
``"report"`` only records. The Trainer checks ``should_training_stop`` after each step, so a
pre-flight problem under ``"stop"`` ends training after its first step; ``"raise"`` stops it
before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from nan_hunter.findings import Report
from nan_hunter.integrations._common import (
    ForwardCapture,
    log_summary,
    model_loss,
    preflight_outcome,
    preflight_scan,
    record_step_event,
    rng_kept,
)
from nan_hunter.training.distributed import ReportTo
from nan_hunter.training.events import OnProblem, TrainingProblem, WatchEvent
from nan_hunter.training.watcher import Watcher

__all__ = ["NanHunterCallback"]


class NanHunterCallback(TrainerCallback):
    """See the module docstring. Attributes: ``events`` (the pre-flight event, step -1, and the
    watcher's), ``preflight`` (the pre-flight ``Report``), ``watcher``, ``report_files``."""

    def __init__(
        self,
        *,
        on_problem: OnProblem = "stop",
        preflight: bool = True,
        loss_fn: Any = None,
        report_to: ReportTo = "rank0",
        max_reports: int = 1,
        **options: Any,
    ) -> None:
        self.on_problem: OnProblem = on_problem
        self.run_preflight = preflight
        self.loss_fn = loss_fn or model_loss
        self.report_to: ReportTo = report_to
        self.max_reports = max_reports
        self.options = options
        self.watcher: Watcher | None = None
        self.preflight: Report | None = None
        self.events: list[WatchEvent] = []
        self.report_files: list[Path] = []
        self._capture: ForwardCapture | None = None
        Watcher(torch.nn.Module(), on_problem=on_problem, report_to=report_to,
                max_reports=max_reports, **options)  # a bad option fails here, not at train time

    # ------------------------------------------------------------------ events

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        model: Any = None, optimizer: Any = None, train_dataloader: Any = None, **kwargs: Any,
    ) -> TrainerControl:
        if model is None:
            return control
        self._close()
        if self.run_preflight and train_dataloader is not None:
            self._preflight(args, control, model, train_dataloader)
        self.watcher = Watcher(
            model, optimizer, None, loss_fn=self.loss_fn, on_problem=self.on_problem,
            report_to=self.report_to, max_reports=self.max_reports, **self.options,
        ).__enter__()
        self.watcher.announce = False  # record_step_event logs, with the report's file
        self._capture = ForwardCapture(model)
        self._capture.install()
        return control

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> TrainerControl:
        if self.watcher is None or self._capture is None:
            return control
        step = self._capture.take()
        kept = len(self.watcher.reports)
        try:
            event = self.watcher.step(
                step.batch if step else None, step.loss if step else None
            )
        except TrainingProblem as problem:
            self._record(args, problem.event, kept)
            raise
        if event is not None:
            self._record(args, event, kept)
            if self.watcher.stopped:
                control.should_training_stop = True
        return control

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> TrainerControl:
        log_summary(self.watcher)
        self._close()
        return control

    # ------------------------------------------------------------------ helpers

    def _preflight(
        self, args: TrainingArguments, control: TrainerControl, model: Any, loader: Any
    ) -> None:
        with rng_kept():
            batch = next(iter(loader), None)
        if batch is None:
            return
        if hasattr(batch, "items"):
            batch = dict(batch.items())
        report = preflight_scan(model, batch, self.loss_fn, self.options)
        self.preflight = report
        if preflight_outcome(
            report, args.output_dir, self.events, self.report_files, self.on_problem
        ):
            control.should_training_stop = True

    def _record(self, args: TrainingArguments, event: WatchEvent, kept: int) -> None:
        new_report = self.watcher is not None and len(self.watcher.reports) > kept
        record_step_event(event, new_report, args.output_dir, self.events, self.report_files)

    def _close(self) -> None:
        if self._capture is not None:
            self._capture.remove()
            self._capture = None
        if self.watcher is not None:
            self.watcher.close()
