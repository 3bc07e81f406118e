"""What the framework callbacks share: capturing the batch and loss of each training forward,
the pre-flight scan, and writing a report (text + JSON) into the run's output folder."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nan_hunter.core.safe_write import write_file
from nan_hunter.engine.traced_forward import default_loss
from nan_hunter.findings import Report
from nan_hunter.report import render
from nan_hunter.training.distributed import current_ranks, rank_path
from nan_hunter.training.events import OnProblem, TrainingProblem, WatchEvent, summary_line
from nan_hunter.training.step_verdict import Reason


def model_loss(output: Any, batch: Any) -> torch.Tensor:
    """The loss a model computed itself (``output.loss``, ``output["loss"]``), else the sum of
    the output's means (as ``scan`` does without a loss function)."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    return default_loss(output)


@dataclass(frozen=True)
class Captured:
    """One training forward: what the model was called with (as ``scan`` takes a batch) and the
    loss it returned, if any."""

    batch: Any
    loss: torch.Tensor | None


class ForwardCapture:
    """Forward hooks on a module that keep the inputs and the loss of each training forward
    (grad enabled, module in train mode) since the last ``take()``. Removed in ``remove()``."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module
        self._handles: list[RemovableHandle] = []
        self._pending: list[Any] = []
        self.captured: list[Captured] = []

    def install(self) -> None:
        if self._handles:
            return
        self._handles = [
            self._module.register_forward_pre_hook(self._before, with_kwargs=True),
            self._module.register_forward_hook(self._after, with_kwargs=True),
        ]

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._pending.clear()
        self.captured.clear()

    def _training(self, module: torch.nn.Module) -> bool:
        return module.training and torch.is_grad_enabled()

    def _before(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self._training(module):
            self._pending.append(dict(kwargs) if kwargs and not args else args)

    def _after(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if not self._pending:
            return
        batch = self._pending.pop()
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, dict):
            loss = output.get("loss")
        loss = loss.detach() if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None
        self.captured.append(Captured(batch, loss))

    def take(self) -> Captured | None:
        """The micro-batch to check and, on a problem, re-run: the first whose loss is not
        finite (one host sync for all), else the last. Clears the list."""
        captured, self.captured = self.captured, []
        if not captured:
            return None
        losses = [c.loss for c in captured if c.loss is not None]
        if len(losses) == len(captured) and len(captured) > 1:
            finite = torch.stack([loss.float() for loss in losses]).isfinite().tolist()
            for c, ok in zip(captured, finite, strict=True):
                if not ok:
                    return c
        return captured[-1]


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Leave Python's, NumPy's and torch's random state as found (a peek at the first batch
    must not change the shuffle the run then draws)."""
    python = random.getstate()
    torch_cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    numpy_state = None
    try:
        import numpy

        numpy_state = numpy.random.get_state()
    except ImportError:
        numpy = None  # type: ignore[assignment]
    try:
        yield
    finally:
        random.setstate(python)
        torch.set_rng_state(torch_cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if numpy is not None and numpy_state is not None:
            numpy.random.set_state(numpy_state)


def write_report(report: Report, folder: str | Path, stem: str) -> tuple[Path, Path]:
    """``folder/stem.txt`` and ``folder/stem.json`` (``stem.rank1.*`` per rank under
    torch.distributed)."""
    ranks = current_ranks()
    base = Path(folder)
    base.mkdir(parents=True, exist_ok=True)
    text = Path(rank_path(str(base / f"{stem}.txt"), ranks))
    data = Path(rank_path(str(base / f"{stem}.json"), ranks))
    write_file(text, render(report, "text"))
    write_file(data, render(report, "json"))
    return text, data


def preflight_outcome(
    report: Report,
    folder: str | Path,
    events: list[WatchEvent],
    report_files: list[Path],
    on_problem: OnProblem,
) -> bool:
    """Write the pre-flight report; when it has an error, record the event and raise
    ``TrainingProblem`` (``on_problem="raise"``) or return whether training should stop."""
    report_files.extend(write_report(report, folder, "nan_hunter_preflight"))
    if not report.errors:
        return False
    event = WatchEvent(
        step=-1, reason=Reason.PREFLIGHT, report=report,
        detail="the first batch breaks under CUDA FP16 autocast (pre-flight scan)",
    )
    events.append(event)
    if on_problem == "raise":
        raise TrainingProblem(event)
    return on_problem == "stop"


def record_step_event(
    event: WatchEvent,
    new_report: bool,
    folder: str | Path,
    events: list[WatchEvent],
    report_files: list[Path],
) -> None:
    """Keep a watcher's event; write its report when the watcher kept a new one, named by the
    1-based step the trainers log (``nan_hunter_step4.*`` for the 4th optimizer step); one
    warning line on the ``nan_hunter`` logger (stderr unless logging is configured)."""
    events.append(event)
    written: tuple[Path, ...] = ()
    if event.report is not None and new_report:
        written = write_report(event.report, folder, f"nan_hunter_step{event.step + 1}")
        report_files.extend(written)
    line = summary_line(dataclasses.replace(event, step=event.step + 1))
    if written:
        line += f"; report {written[0]}"
    if current_ranks() is None or event.rank == 0:
        logging.getLogger("nan_hunter").warning("nan-hunter: %s", line)


def log_summary(watcher: Any) -> None:
    """One warning line at the end of training: steps checked, problem steps, where."""
    if watcher is None or (current_ranks() is not None and watcher.rank != 0):
        return
    steps = watcher.steps
    line = f"{steps} optimizer step{'s' * (steps != 1)} checked"
    if watcher.problems:
        first = watcher.reports[0].step + 1 if watcher.reports else None
        at = f" (the first at step {first})" if first is not None else ""
        line += f", {watcher.problems} problem step{'s' * (watcher.problems != 1)}{at}"
    else:
        line += ", no problem"
    logging.getLogger("nan_hunter").warning("nan-hunter: %s", line)


PREFLIGHT = {"dtype": "float16", "policy": "cuda", "device": "cpu", "numerics": "emulated"}
"""The pre-flight scan: CUDA's FP16 autocast policy, emulated on the CPU (options override)."""


def preflight_scan(
    module: torch.nn.Module,
    batch: Any,
    loss_fn: Any,
    options: dict[str, Any],
    rerun_as: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
) -> Report:
    """Scan a copy of ``module`` on ``batch`` as it will run under CUDA FP16 autocast (on the
    CPU, emulated): the user's module, wherever it lives, is not touched."""
    from nan_hunter.api import scan
    from nan_hunter.training.model_copy import replay_copy

    replay = replay_copy(module)
    if rerun_as is not None:
        replay = rerun_as(replay)
    return scan(replay, batch, loss_fn, **{**PREFLIGHT, **options})
