"""nan-hunter: find where and why FP16 mixed precision breaks a PyTorch model, and fix it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nan_hunter.version import __version__

__all__ = [
    "StepsResult",
    "TrainingProblem",
    "WatchEvent",
    "Watcher",
    "__version__",
    "render",
    "run_steps",
    "scan",
    "scan_file",
    "watch",
]

if TYPE_CHECKING:
    from nan_hunter.api import scan, scan_file
    from nan_hunter.report import render
    from nan_hunter.training import (
        StepsResult,
        TrainingProblem,
        Watcher,
        WatchEvent,
        run_steps,
        watch,
    )

_API = ("scan", "scan_file")
_TRAINING = ("StepsResult", "TrainingProblem", "WatchEvent", "Watcher", "run_steps", "watch")


def __getattr__(name: str) -> Any:
    # Lazy: `import nan_hunter` stays cheap (no torch import) until the API is used.
    # `watch` is the function from nan_hunter.training (the old module nan_hunter.watch, kept
    # for its imports, is callable as the function too).
    if name == "render":  # torch-free: the report layer only
        from nan_hunter.report import render

        return render
    if name in _API:
        from nan_hunter import api

        return getattr(api, name)
    if name in _TRAINING:
        from nan_hunter import training

        return getattr(training, name)
    raise AttributeError(f"module 'nan_hunter' has no attribute {name!r}")
