"""What the watcher and ``run``'s watch hand back: events (data, not text) and the exception of
``"raise"``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from nan_hunter.errors import NanHunterError
from nan_hunter.findings import Report
from nan_hunter.training.step_verdict import Reason

if TYPE_CHECKING:
    from nan_hunter.training.repro import ReproSource

OnProblem = Literal["report", "raise", "stop"]
ON_PROBLEM: tuple[OnProblem, ...] = ("report", "raise", "stop")


@dataclass(frozen=True)
class WatchEvent:
    """A step that tripped the watcher, and the scan of it."""

    step: int
    """0-based index of the ``w.step()`` call (``run_steps``: of the optimizer step)."""
    reason: Reason
    report: Report | None
    """The scan of the step's batch; None when it could not be re-run (``detail`` says why).
    Distributed: the origin rank's scan, on the ranks that receive it (``report_to``)."""
    detail: str = ""
    """One line for a person: what was seen."""
    scale: float | None = None
    """The loss scale this step ran with (None without an enabled GradScaler)."""
    pre_step: bool = False
    """True when the re-run used the weights this step's forward ran with (the GradScaler
    skipped the step, or the optimizer pre-hook copied the model before the update); False
    when it used the weights after the optimizer step."""
    rank: int = 0
    """The rank this event was made on (0 without torch.distributed)."""
    world_size: int = 1
    origin_rank: int | None = None
    """The rank whose scan is ``report``: the first rank whose own loss went non-finite (else
    the first rank whose scan found an error, else the first rank that saw a problem). None
    when no rank could scan."""
    report_path: str | None = None
    """Where this rank wrote its JSON report (``output=``), if it did."""


class TrainingProblem(NanHunterError):
    """Raised by ``w.step()`` under ``on_problem="raise"``; ``event`` says what happened."""

    def __init__(self, event: WatchEvent) -> None:
        self.event = event
        where = f" (rank {event.rank} of {event.world_size})" if event.world_size > 1 else ""
        message = f"training step {event.step}{where}: {event.detail or event.reason.value}"
        first = event.report.findings[0] if event.report and event.report.findings else None
        if first is not None:
            at = f" at {first.location.render()}" if first.location else ""
            origin = (
                f" on rank {event.origin_rank}"
                if event.world_size > 1 and event.origin_rank is not None
                else ""
            )
            message += f"; first finding{origin} {first.code} {first.op or 'input'}{at}"
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


def summary_line(event: WatchEvent) -> str:
    """One line for a log: step, rank, reason, the origin's first finding and the verdict on
    the cause."""
    ranks = f" on {event.world_size} ranks" if event.world_size > 1 else ""
    origin = (
        f", origin rank {event.origin_rank}"
        if event.origin_rank is not None and event.world_size > 1 else ""
    )
    line = f"training step {event.step}{ranks}: {event.reason.value}{origin}"
    first = event.report.findings[0] if event.report and event.report.findings else None
    if first is not None:
        at = f" at {first.location.render()}" if first.location else ""
        module = f" in {first.module}" if first.module else ""
        line += f"; {first.code} {first.op or 'input'}{module}{at}"
    elif event.report is not None:
        line += "; the re-run of the step is clean"
    training = event.report.training if event.report is not None else None
    if training is not None and training.verdict is not None:
        line += f" ({training.verdict.label})"
    if event.report_path:
        line += f"; report {event.report_path}"
    return line


@dataclass(frozen=True)
class RunEvent:
    """A training step of the script that tripped the check, and the re-run of it."""

    step: int
    """1-based index of the optimizer step (as trainers count them)."""
    reason: Reason
    detail: str
    report: Report | None
    """The scan of the step's model call; None when it could not be re-run (``why_not``)."""
    model: str = ""
    """The class of the model that was re-run."""
    why_not: str = ""
    scale: float | None = None
    repro: ReproSource | None = None
    """What the step's reproduction bundle is made of (by reference, valid while the
    ``on_problem`` call lasts); None unless asked for, or when the step was not re-run."""
