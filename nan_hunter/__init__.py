"""nan-hunter: find where and why FP16 mixed precision breaks a PyTorch model, and fix it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "scan", "scan_file"]

if TYPE_CHECKING:
    from nan_hunter.api import scan, scan_file


def __getattr__(name: str) -> Any:
    # Lazy: `import nan_hunter` stays cheap (no torch import) until the API is used.
    if name in ("scan", "scan_file"):
        from nan_hunter import api

        return getattr(api, name)
    raise AttributeError(f"module 'nan_hunter' has no attribute {name!r}")
