"""The Python API the CLI is built on: ``scan`` an in-memory model, ``scan_file`` a model file."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

from nan_hunter.config import Settings, load_settings
from nan_hunter.engine import scan_target
from nan_hunter.findings import Report
from nan_hunter.loader import Names, Target, as_batch, load_target
from nan_hunter.runner import LossFn


def scan(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: LossFn | None = None,
    *,
    settings: Settings | None = None,
    config_file: Path | None = None,
    **options: Any,
) -> Report:
    """Scan ``model`` on ``batch`` (a Tensor, tuple or dict, as ``sample_batch`` returns).

    ``options`` are settings by name (``dtype="bfloat16"``, ``backward=False``, ...), applied on
    top of ``settings`` or of ``configs/default.yaml`` and ``config_file``. The model is left
    bit-identical.
    """
    if settings is None:
        settings = load_settings(config_file, options)
    elif options:
        settings = load_settings(config_file, {**_as_overrides(settings), **options})
    source = inspect.getsourcefile(type(model)) or "<model>"
    target = Target(
        model=model,
        batch=as_batch(batch, source="batch"),
        loss_fn=loss_fn,
        file=Path(source).resolve() if source != "<model>" else Path(source),
        module_name=type(model).__module__,
    )
    return scan_target(target, settings)


def _as_overrides(settings: Settings) -> dict[str, Any]:
    return {
        name: getattr(settings, name)
        for name in settings.__dataclass_fields__
        if name != "sources"
    }


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
