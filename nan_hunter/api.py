"""The Python API the CLI is built on: ``scan`` an in-memory model, ``scan_file`` a model file."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

from nan_hunter.config import Settings, load_settings
from nan_hunter.engine import scan_target
from nan_hunter.findings import Report
from nan_hunter.loader import (
    Names,
    Target,
    as_batch,
    check_model,
    load_target,
    model_folder,
    unwrap_model,
)
from nan_hunter.options import settings_with
from nan_hunter.runner import LossFn
from nan_hunter.suppressions import apply_suppressions


def scan(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: LossFn | None = None,
    *,
    settings: Settings | None = None,
    config_file: Path | None = None,
    **options: Any,
) -> Report:
    """Scan ``model`` on ``batch`` under emulated FP16 autocast and return the ``Report``.

    ``batch`` is what ``sample_batch()`` returns in a model file: a Tensor (``model(x)``), a tuple
    or list (positional arguments) or a dict with string keys (keyword arguments). ``loss_fn(output,
    batch)`` returns a scalar tensor; without it the loss is the sum of the means of all
    floating-point tensors in the output (a model that returns its own scalar loss needs none).

    ``options`` are settings by name, as in ``configs/default.yaml`` and the CLI flags; they apply
    on top of ``settings`` when given, else on top of the defaults and ``config_file``:

    - ``dtype``: ``"float16"`` (default) or ``"bfloat16"``; ``torch.float16``/``torch.bfloat16``
      are accepted too.
    - ``device``: ``"auto"`` (default: cuda when available), ``"cpu"`` or ``"cuda"``.
    - ``mode``: ``"autocast"`` (default) or ``"half"`` (model and batch in FP16, no autocast).
    - ``policy``: whose autocast op lists to apply: ``"cuda"`` (default, also on a CPU),
      ``"cpu"`` or ``"native"``.
    - ``numerics``: on a CPU, ``"emulated"`` (default: FP32 kernels, FP16 rounding) or ``"real"``.
    - ``backward``: run the backward too (default True).
    - ``grad_scale``: loss scale for the backward, as ``GradScaler`` applies it: ``"dynamic"``
      (default: GradScaler's 2**16, backed off when the gradients overflow), a fixed number
      (``65536``, ``"2**16"``) or ``"none"``.
    - ``select``, ``ignore``: rule codes or prefixes (a string or a sequence: ``ignore=["NH5"]``).
    - ``underflow_share``, ``underflow_min_count``, ``max_warnings``, ``upstream_depth``,
      ``grad_underflow_share``: thresholds, see ``configs/default.yaml``.
    - ``fail_on``: ``"error"`` or ``"warning"``: the CLI's exit-code threshold (the report lists
      both severities; ``Report.exit_code(fail_on)`` applies one).

    An unknown option or a bad value raises ``nan_hunter.errors.ConfigError``, an error in the
    model's own code ``nan_hunter.errors.UserCodeError``. A model wrapped by
    ``torch.compile``, ``DataParallel`` or ``DistributedDataParallel`` is unwrapped and its
    original module scanned. The model is left bit-identical (parameters, buffers, ``.grad``,
    train/eval mode, hooks, ``requires_grad``).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"nan_hunter.scan(): model must be a torch.nn.Module, got {type(model)}")
    if settings is None or options:
        settings = settings_with(settings, options, "nan_hunter.scan()", config_file)
    check_model(model, "the model")
    model, unwrapped = unwrap_model(model)
    source = _source_file(model)
    target = Target(
        model=model,
        batch=as_batch(batch, source="batch"),
        loss_fn=loss_fn,
        file=source,
        module_name=type(model).__module__,
        unwrapped=unwrapped,
    )
    return apply_suppressions(scan_target(target, settings))


def _source_file(model: torch.nn.Module) -> Path:
    """The file defining the model's class (the patch is written against it), or ``<model>``
    when its source is not available (a class defined in ``python -c`` or in a REPL)."""
    try:
        source = inspect.getsourcefile(type(model))
    except (TypeError, OSError):
        source = None
    if not source:
        return Path("<model>")
    if source.startswith("<"):  # <stdin>, <string>: a pseudo-file, not a path to resolve
        return Path(source)
    return Path(source).resolve()


def scan_file(
    spec: str,
    settings: Settings | None = None,
    *,
    names: Names | None = None,
    weights: Path | None = None,
    batch_file: Path | None = None,
) -> Report:
    """Load the model file ``spec`` (path or ``pkg.module``) and scan it. Findings on a line
    with a ``# nan-hunter: ignore[CODE] -- reason`` comment come back suppressed."""
    with model_folder(spec):  # for imports inside build_model() and forward, too
        target = load_target(spec, names or Names(), weights=weights, batch_file=batch_file)
        return apply_suppressions(scan_target(target, settings or load_settings()))
