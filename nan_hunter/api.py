"""The Python API the CLI is built on."""

from __future__ import annotations

from pathlib import Path

from nan_hunter.config import Settings, load_settings
from nan_hunter.engine import scan_target
from nan_hunter.findings import Report
from nan_hunter.loader import Names, load_target


def scan_file(
    spec: str,
    settings: Settings | None = None,
    *,
    names: Names | None = None,
    weights: Path | None = None,
    batch_file: Path | None = None,
) -> Report:
    """Load the model file ``spec`` (path or ``pkg.module``) and scan it."""
    target = load_target(spec, names or Names(), weights=weights, batch_file=batch_file)
    return scan_target(target, settings or load_settings())
