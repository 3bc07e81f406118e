"""Verification for a model given as an object (``nan_hunter.scan``, the pytest plugin).

There is no entry file to re-run, so inside the overlay of the project the modules that define
the model's classes are imported again (from the patched files), and a deep copy of the model
gets the patched classes: same parameters and buffers, patched ``forward`` code. The loss
function, when it comes from the project, is taken from the patched module too.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nan_hunter.errors import LoadError, UserCodeError
from nan_hunter.findings import Report
from nan_hunter.project.paths import in_project, project_root


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
        try:
            return scan(copied, fresh(loss_fn) if loss_fn is not None else None)
        except UserCodeError as exc:
            script = modules.get("__main__")
            left_out = getattr(script, LEFT_OUT, None)
            if left_out and "NameError" in str(exc):
                count, line = left_out
                raise UserCodeError(
                    f"{exc} (the script's own program, {count} top-level statements from line "
                    f"{line}, is not run again to verify a fix: only its imports, functions, "
                    "classes and assignments without a call are; define what the model needs "
                    "among those)"
                ) from exc
            raise

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
    if name == "__main__":
        return _definitions_of_script(file)
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


SCRIPT_MODULE = "__nan_hunter_patched_main__"
LEFT_OUT = "__nan_hunter_left_out__"
"""On a script's module: how many top-level statements were not run, and the first one's line."""


def _definitions_of_script(file: Path) -> Any:
    """The caller's own script (``__main__``), patched, with only its definitions run: imports,
    functions, classes and assignments that call nothing. Its top level is the caller's program
    (training, checkpoint writes, the ``nan_hunter.scan`` call that is verifying right now, a
    ``sys.exit``) and must not run a second time, with or without a ``__main__`` guard. Line
    numbers stay those of the file, so findings map back to it."""
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (OSError, SyntaxError, ValueError) as exc:
        raise LoadError(f"cannot read the patched {file.name}: {exc}") from exc
    left_out = [node for node in tree.body if not _is_definition(node)]
    tree.body = [node for node in tree.body if _is_definition(node)]
    module = types.ModuleType(SCRIPT_MODULE)
    module.__file__ = str(file)
    setattr(module, LEFT_OUT, (len(left_out), left_out[0].lineno) if left_out else None)
    sys.modules[SCRIPT_MODULE] = module
    try:
        exec(compile(tree, str(file), "exec"), module.__dict__)
    except Exception as exc:
        skipped = (
            f" (the rest of its top level, {len(left_out)} statements from line "
            f"{left_out[0].lineno}, was not run again)" if left_out else ""
        )
        raise LoadError(
            f"the definitions of the patched {file.name} fail to run: {type(exc).__name__}: "
            f"{exc}{skipped}"
        ) from exc
    return module


def _is_definition(node: ast.stmt) -> bool:
    """A statement of a script's top level that only defines (imports, functions, classes,
    assignments without a call): the program around them does not run."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        return not any(isinstance(n, (ast.Call, ast.Await, ast.Yield)) for n in ast.walk(node))
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True  # the docstring
    if isinstance(node, ast.Try):  # try: import fast_lib / except ImportError: fast_lib = None
        return all(_is_definition(n) for n in
                   [*node.body, *(n for h in node.handlers for n in h.body), *node.orelse])
    return False
