"""Verification for a model given as an object (``nan_hunter.scan``, the pytest plugin).

There is no entry file to re-run, so inside the overlay of the project the modules that define
the model's classes are imported again (from the patched files), and a deep copy of the model
gets the patched classes: same parameters and buffers, patched ``forward`` code. The loss
function, when it comes from the project, is taken from the patched module too.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nan_hunter.errors import LoadError
from nan_hunter.findings import Report
from nan_hunter.project import in_project, project_root


def patched_model_scan(
    model: torch.nn.Module,
    loss_fn: Callable[..., Any] | None,
    entry: Path,
    scan: Callable[[torch.nn.Module, Callable[..., Any] | None], Report],
) -> Callable[[Path], Report]:
    """A ``Rescan`` for ``verify_fixes(..., entry)``: called inside the overlay, it rebuilds
    ``model`` with its project classes imported from the overlay's (patched) files and scans
    it with ``scan``."""
    root = project_root(entry)
    # Where each project object comes from, found before the overlay sets the modules aside.
    origins: dict[int, tuple[str, str, Path]] = {}
    for obj in [*(type(m) for m in model.modules()), loss_fn]:
        source = _source(obj)
        if obj is not None and source is not None and in_project(str(source), root):
            origins[id(obj)] = (obj.__module__, obj.__qualname__, source.relative_to(root))

    def rescan(shadow_entry: Path) -> Report:
        shadow = Path(*shadow_entry.parts[: len(shadow_entry.parts) - len(
            entry.resolve().relative_to(root).parts)])
        modules: dict[str, Any] = {}

        def fresh(obj: Any) -> Any:
            if id(obj) not in origins:
                return obj
            name, qualname, rel = origins[id(obj)]
            if name not in modules:
                modules[name] = _import(name, shadow / rel)
            found: Any = modules[name]
            for part in qualname.split("."):
                found = getattr(found, part, None)
                if found is None:
                    raise LoadError(f"{qualname} is no longer defined in the patched {rel}")
            return found

        copied = copy.deepcopy(model)
        for sub in copied.modules():
            cls = fresh(type(sub))
            if cls is not type(sub):
                sub.__class__ = cls
        return scan(copied, fresh(loss_fn) if loss_fn is not None else None)

    return rescan


def _source(obj: Any) -> Path | None:
    try:
        file = inspect.getsourcefile(obj)
    except TypeError:
        return None
    return Path(file).resolve() if file else None


def _import(name: str, file: Path) -> Any:
    """The module ``name`` as the overlay has it: by name (packages, relative imports), else
    from its file in the overlay."""
    try:
        module = importlib.import_module(name)
        if module.__file__ and Path(module.__file__).resolve() == file.resolve():
            return module
    except Exception:  # not importable by name from the overlay: load it from its file
        pass
    if name == "__main__":  # a script: its ``if __name__ == "__main__":`` block must not run
        name = "__nan_hunter_patched_main__"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot load the patched {file.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise LoadError(
            f"the patched {file.name} fails to import: {type(exc).__name__}: {exc}"
        ) from exc
    return module
