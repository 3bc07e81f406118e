"""nan-hunter: find where and why FP16 mixed precision breaks a PyTorch model, and fix it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "StepsResult",
    "TrainingProblem",
    "WatchEvent",
    "Watcher",
    "__version__",
    "run_steps",
    "scan",
    "scan_file",
]

if TYPE_CHECKING:
    from nan_hunter.api import scan, scan_file
    from nan_hunter.watch import StepsResult, TrainingProblem, Watcher, WatchEvent, run_steps

_API = ("scan", "scan_file")
_WATCH = ("StepsResult", "TrainingProblem", "WatchEvent", "Watcher", "run_steps")


def __getattr__(name: str) -> Any:
    # Lazy: `import nan_hunter` stays cheap (no torch import) until the API is used. The
    # watch() function itself lives at nan_hunter.watch.watch (the submodule has its name).
    if name in _API:
        from nan_hunter import api

        return getattr(api, name)
    if name in _WATCH:
        import nan_hunter.watch as watching

        return getattr(watching, name)
    raise AttributeError(f"module 'nan_hunter' has no attribute {name!r}")
