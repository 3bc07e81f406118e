"""The Python API the CLI is built on: ``scan`` an in-memory model, ``scan_file`` a model file."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nan_hunter.core.batch import Batch, LossFn
from nan_hunter.engine.scan import scan_target
from nan_hunter.findings import Report
from nan_hunter.fixes.dataflow import model_probe
from nan_hunter.fixes.in_memory import patched_model_scan
from nan_hunter.fixes.verify import verify_fixes
from nan_hunter.project.config import Settings, load_settings
from nan_hunter.project.loader import (
    Names,
    Target,
    as_batch,
    check_model,
    folder_on_path,
    load_target,
    model_folder,
    refuse_replaced_torch,
    unwrap_model,
)
from nan_hunter.project.options import settings_with
from nan_hunter.project.paths import is_installed, project_root
from nan_hunter.project.suppressions import apply_suppressions


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
    or list (positional arguments), a dict with string keys (keyword arguments) or a
    ``nan_hunter.core.batch.Batch`` (both, as a real call had them). ``loss_fn(output,
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
    model's own code ``nan_hunter.errors.UserCodeError``, a failure of nan-hunter's own code
    while the model ran ``nan_hunter.errors.InternalError`` (a bug to report; ``original`` is
    the exception it stands for). A model wrapped by
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
        batch=batch if isinstance(batch, Batch) else as_batch(batch, source="batch"),
        loss_fn=loss_fn,
        file=source,
        module_name=type(model).__module__,
        unwrapped=unwrapped,
    )
    report = apply_suppressions(scan_target(target, settings))
    if settings.verify_fixes and source.is_file() and any(
        f.fix is not None and (f.fix.edits or f.fix.alternatives) for f in report.findings
    ):

        def scan_copy(patched: torch.nn.Module, patched_loss: LossFn | None) -> Report:
            copy_target = dataclasses.replace(target, model=patched, loss_fn=patched_loss)
            return scan_target(copy_target, settings, fp32_loss=True)

        rescan = patched_model_scan(model, loss_fn, source, scan_copy)
        probe = model_probe(model, target.batch, loss_fn)
        report = verify_fixes(report, rescan, source, probe)
    return _named_by_the_script(report, model, source)


def _named_by_the_script(report: Report, model: torch.nn.Module, source: Path) -> Report:
    """A model whose class an installed library defines (a transformers model) is reported
    under the script that runs it (``__main__``'s file, a training script under a Trainer or
    ``nan-hunter run``), with a note naming the library's file: the header named
    ``modeling_bert.py``. Findings keep their own files and lines."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if not source.is_file() or not is_installed(str(source)) or not main:
        return report
    if is_installed(main) or not Path(main).is_file():
        return report
    target = report.target
    note = f"the model's class {type(model).__qualname__} is defined in {source}"
    return dataclasses.replace(report, target=dataclasses.replace(
        target, file=str(Path(main).resolve()), notes=(*target.notes, note),
    ))


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
    verify: bool | None = None,
) -> Report:
    """Load the model file ``spec`` (path or ``pkg.module``) and scan it. Findings on a line
    with a ``# nan-hunter: ignore[CODE] -- reason`` comment come back suppressed.

    Fixes with edits are verified (``verify``, default: the ``verify_fixes`` setting, on by
    default): the project is re-scanned with each fix applied (see ``nan_hunter.fixes.verify``)
    and ``fix.verified``/``fix.remaining`` say what the re-scan found."""
    settings = settings or load_settings()
    names = names or Names()

    loaded: list[Target] = []

    def scan_once(
        spec: str, search: Path | None = None, fp32_loss: bool = False
    ) -> tuple[Report, Path]:
        # the model's folder on sys.path for the whole scan: imports inside build_model() and
        # forward find its siblings (a dotted spec re-scanned in the overlay: its folder there)
        with folder_on_path(search) if search is not None else model_folder(spec):
            target = load_target(
                spec, names, weights=weights, batch_file=batch_file, search=search
            )
            if not loaded:  # the first scan's model, for the data-flow probe
                loaded.append(target)
            report = scan_target(target, settings, fp32_loss=fp32_loss)
            refuse_replaced_torch(target.file, "the scan")  # a forward that replaced them
            return apply_suppressions(report), target.file

    report, entry = scan_once(spec)
    if settings.verify_fixes if verify is None else verify:
        first = loaded.pop()
        probe = model_probe(first.model, first.batch, first.loss_fn)
        del first  # the probe lets go of the model once it has run (before the re-scans)
        report = verify_fixes(report, _rescan_of(spec, entry, scan_once), entry, probe)
    return report


def _rescan_of(
    spec: str, entry: Path, scan_once: Callable[[str, Path | None, bool], tuple[Report, Path]]
) -> Callable[[Path], Report]:
    """How verification re-runs the original entry in its overlay: by its file there, or, for a
    dotted ``pkg.module`` spec, by the same name imported from the overlay of the working
    directory (so the entry's own relative imports work). Each re-scan measures the patched
    model's FP32 loss too (how much a fix changes what the model computes)."""
    if spec.endswith(".py") or Path(spec).exists():
        return lambda shadow_entry: scan_once(str(shadow_entry), None, True)[0]
    root = project_root(entry)
    depth = len(entry.resolve().relative_to(root).parts)

    def rescan(shadow_entry: Path) -> Report:
        shadow_root = shadow_entry.parents[depth - 1]
        cwd = Path.cwd().resolve()
        search = shadow_root / cwd.relative_to(root) if cwd.is_relative_to(root) else cwd
        return scan_once(spec, search, True)[0]

    return rescan
