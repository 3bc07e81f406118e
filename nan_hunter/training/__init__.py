"""Training loops: ``watch`` (per-step check, distributed agreement), ``run_steps`` (``--steps``).

Modules: ``verdict`` (is this step a problem), ``checks`` (finite flags, GradScaler's scale),
``events`` (``WatchEvent``, ``TrainingProblem``, ``StepsResult``), ``watcher`` (``watch``),
``replay`` (the module a re-run scans: wrappers removed, FSDP gathered), ``distributed``
(agreement across ranks), ``clipping`` (clip-before-unscale), ``steps`` (``run_steps``).
"""

from __future__ import annotations

from nan_hunter.training.checks import finite_flag, grads_finite_flag
from nan_hunter.training.clipping import WatchWarning
from nan_hunter.training.events import (
    OnProblem,
    StepsResult,
    TrainingProblem,
    WatchEvent,
    summary_line,
)
from nan_hunter.training.step_verdict import Reason
from nan_hunter.training.steps import DEFAULT_LR, run_steps
from nan_hunter.training.watcher import Watcher, watch

__all__ = [
    "DEFAULT_LR",
    "OnProblem",
    "Reason",
    "StepsResult",
    "TrainingProblem",
    "WatchEvent",
    "WatchWarning",
    "Watcher",
    "finite_flag",
    "grads_finite_flag",
    "run_steps",
    "summary_line",
    "watch",
]
