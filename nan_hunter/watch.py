"""Kept for imports written before ``nan_hunter.training``: ``from nan_hunter.watch import watch``.

``from nan_hunter import watch`` is the function. This module shares its name, so once it has
been imported ``nan_hunter.watch`` is this module; it is callable, as the function, so that
``nan_hunter.watch(model, ...)`` works either way.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from nan_hunter.training import (
    DEFAULT_LR,
    OnProblem,
    Reason,
    StepsResult,
    TrainingProblem,
    Watcher,
    WatchEvent,
    WatchWarning,
    finite_flag,
    grads_finite_flag,
    run_steps,
    summary_line,
    watch,
)

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


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Watcher:
        return watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
