"""Discovery: import the user's model file and build the model, batch and loss from it.

The file (a path, or ``pkg.module``) defines ``build_model()``, ``sample_batch()`` and optionally
``loss_fn(output, batch)``; the names can be changed. It is imported with its folder first on
``sys.path``, restored afterwards. Weights and saved batches are loaded with
``torch.load(..., weights_only=True)`` (or safetensors), never with pickle.

A model wrapped by ``torch.compile`` (an ``OptimizedModule``, the original in ``_orig_mod``) or by
``DataParallel``/``DistributedDataParallel`` (the original in ``.module``) is unwrapped: the scan
traces the original module's eager code, and ``Target.unwrapped`` says which wrappers were removed.

One concept, one file (about 500 lines): everything between a path on the command line and a
``Target`` whose every part came from the user's code, with whose error each failure is.
"""

from __future__ import annotations

import importlib
import importlib.util
import keyword
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from nan_hunter.core.batch import Batch, LossFn
from nan_hunter.errors import NOT_THE_MODELS, LoadError, UserCodeError, first_line
from nan_hunter.precision import device_alias
from nan_hunter.process import activity
from nan_hunter.project.targets import check_model_file
from nan_hunter.trace.call_sites import frame_origin
from nan_hunter.trace.torch_originals import replaced


@dataclass(frozen=True)
class Target:
    """What a scan runs: the user's model, batch and loss, and where they came from."""

    model: torch.nn.Module
    batch: Batch
    loss_fn: LossFn | None
    file: Path
    """The model file (the patch is written against it)."""
    module_name: str
    unwrapped: tuple[str, ...] = ()
    """Wrappers removed from the model as built, outermost first (see ``unwrap_model``)."""
    model_fn: str | None = None
    """The function of ``file`` that built the model (``build_model``); None when the model
    came from elsewhere (``nan_hunter.scan(model, ...)``)."""


@dataclass(frozen=True)
class Names:
    model_fn: str = "build_model"
    batch_fn: str = "sample_batch"
    loss_fn: str = "loss_fn"


def load_target(
    spec: str,
    names: Names | None = None,
    *,
    weights: Path | None = None,
    batch_file: Path | None = None,
    search: Path | None = None,
) -> Target:
    """``search``: the folder a dotted ``spec`` is imported from (default: the working
    directory; verification passes its overlay of it)."""
    names = names or Names()
    started_in = Path.cwd()
    module = import_user_module(spec, search)
    file = Path(module.__file__ or spec).resolve()
    build = _function(module, names.model_fn, "--model-fn", required=True)
    assert build is not None
    built = _call_user(build, names.model_fn)
    if not isinstance(built, torch.nn.Module):
        raise LoadError(
            f"{names.model_fn}() in {file.name} must return a torch.nn.Module, "
            f"got {type(built).__name__}"
        )
    # Files named relative to where the scan started, even if the model's code changed folder.
    weights, batch_file = (_from(started_in, p) for p in (weights, batch_file))
    check_model(built, f"the model {names.model_fn}() returned", values=weights is None)
    if weights is not None:
        load_weights(built, weights)
        check_model(built, f"the model {names.model_fn}() returned, with --weights loaded,")
    model, unwrapped = unwrap_model(built)
    if batch_file is not None:
        raw = load_tensors(batch_file, what="batch")
    else:
        make_batch = _function(module, names.batch_fn, "--batch-fn", required=True)
        assert make_batch is not None
        raw = _call_user(make_batch, names.batch_fn)
    batch = as_batch(raw, source=f"{names.batch_fn}()" if batch_file is None else str(batch_file))
    # loss_fn() is optional; a name the user chose (--loss-fn) must exist: a typo must not
    # leave the scan on the default loss
    loss = _function(
        module, names.loss_fn, "--loss-fn", required=names.loss_fn != Names().loss_fn
    )
    refuse_replaced_torch(file, "its import, build_model() and sample_batch()")
    return Target(
        model=model,
        batch=batch,
        loss_fn=loss,
        file=file,
        module_name=module.__name__,
        unwrapped=unwrapped,
        model_fn=names.model_fn,
    )


def refuse_replaced_torch(file: Path, during: str) -> None:
    """A ``LoadError`` when the user's code (``during`` says which) replaced a torch function
    a scan's verdicts rest on (``torch_originals.replaced``): nan-hunter's own checks use
    torch's real ones, but the model would compute with the replacement (an autocast that does
    nothing on a CPU), and a scan of that is no scan of the model as it trains."""
    names = replaced(autocast_methods=not device_alias.held())
    if names:
        raise LoadError(
            f"{file.name} replaced {', '.join(names)} during {during}: nan-hunter checks values "
            "with torch's own functions and will not scan a model that runs on replacements; "
            "remove the replacement to scan it"
        )


def _from(folder: Path, path: Path | None) -> Path | None:
    if path is None or path.is_absolute() or Path.cwd() == folder:
        return path
    return folder / path


def unwrap_model(model: torch.nn.Module) -> tuple[torch.nn.Module, tuple[str, ...]]:
    """The module a wrapper runs, and a note per wrapper removed (outermost first).

    ``torch.compile`` returns an ``OptimizedModule`` whose original module is ``_orig_mod``;
    tracing the compiled one would trace dynamo, not the user's ops. ``DataParallel`` and
    ``DistributedDataParallel`` hold theirs in ``.module`` (the scan runs on one device). The
    parameters are shared, so the model as built is still the one left bit-identical.
    """
    notes: list[str] = []
    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = _wrapped(model)
        if inner is None:
            break
        attribute, kind = inner
        notes.append(
            f"{kind}: scanned the original module {type(getattr(model, attribute)).__name__} "
            f"({type(model).__name__}.{attribute})"
        )
        model = getattr(model, attribute)
    return model, tuple(notes)


def _wrapped(model: torch.nn.Module) -> tuple[str, str] | None:
    """(attribute holding the original module, what wraps it), or None for a plain module."""
    if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
        return ("module", type(model).__name__) if _is_module(model, "module") else None
    if _is_module(model, "_orig_mod"):  # torch._dynamo.eval_frame.OptimizedModule
        return "_orig_mod", "torch.compile"
    return None


def _is_module(model: torch.nn.Module, attribute: str) -> bool:
    return isinstance(model._modules.get(attribute), torch.nn.Module)


MAX_BATCH_DEPTH = 32
"""Containers in a batch nest at most this deep (deeper, or a list holding itself, is refused)."""


def check_model(model: torch.nn.Module, source: str, *, values: bool = True) -> None:
    """Models nan-hunter cannot trace get one clear line instead of a failure deep inside.
    ``values``: also require parameters with values (not on the meta device)."""
    if isinstance(model, torch.jit.ScriptModule):
        raise LoadError(
            f"{source} is a TorchScript module (torch.jit.script/trace): nan-hunter traces eager "
            "PyTorch; return the nn.Module before scripting it"
        )
    for name, tensor in [*model.named_parameters(), *model.named_buffers()] if values else []:
        if tensor.is_meta:
            raise LoadError(
                f"{source} is on the meta device ({name} has no values): create it on a real "
                "device, or call model.to_empty(device='cpu') and load its weights"
            )


def _check_batch(raw: Any, source: str) -> None:
    """Depth, and tensors a scan can run on: dense, with values, not all empty."""
    tensors: list[tuple[str, torch.Tensor]] = []
    stack: list[tuple[Any, str, int]] = [(raw, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_BATCH_DEPTH:
            raise LoadError(
                f"{source} returned a batch nested more than {MAX_BATCH_DEPTH} levels deep "
                "(or a container that holds itself)"
            )
        if isinstance(item, torch.Tensor):
            tensors.append((where, item))
        elif isinstance(item, (tuple, list)):
            stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(item))
        elif isinstance(item, Mapping):
            stack.extend((x, f"{where}[{k!r}]", depth + 1) for k, x in item.items())
    for where, tensor in tensors:
        at = f" at batch{where}" if where else ""
        if tensor.layout != torch.strided:
            raise LoadError(
                f"{source} returned a {str(tensor.layout).removeprefix('torch.')} tensor{at}: "
                "nan-hunter scans dense tensors; pass x.to_dense()"
            )
        if tensor.is_meta:
            raise LoadError(f"{source} returned a tensor on the meta device{at}: it has no values")
        if tensor.is_nested:  # strided nested tensors have the strided layout
            raise LoadError(
                f"{source} returned a nested tensor{at}: nan-hunter scans dense tensors; pass "
                "x.to_padded_tensor(0.0)"
            )
    if tensors and all(t.numel() == 0 for _, t in tensors):
        shape = tuple(tensors[0][1].shape)
        raise LoadError(
            f"{source} returned only empty tensors (shape {shape}): nothing to scan; "
            "return at least one sample"
        )


def as_batch(raw: Any, source: str) -> Batch:
    _check_batch(raw, source)
    if isinstance(raw, torch.Tensor):
        return Batch(args=(raw,), kwargs={}, raw=raw)
    if isinstance(raw, (tuple, list)):
        return Batch(args=tuple(raw), kwargs={}, raw=raw)
    if isinstance(raw, Mapping):  # a dict, or a mapping such as transformers' BatchEncoding
        bad = [k for k in raw if not isinstance(k, str)]
        if bad:
            raise LoadError(f"{source} returned a dict whose keys are not all strings: {bad[0]!r}")
        return Batch(args=(), kwargs=dict(raw), raw=raw)
    raise LoadError(
        f"{source} must return a Tensor, a tuple of Tensors or a dict, got {type(raw).__name__}"
    )


@contextmanager
def folder_on_path(folder: Path) -> Iterator[None]:
    """``folder`` first on ``sys.path``; no ``__pycache__`` written next to the user's files."""
    saved = list(sys.path)
    saved_bytecode = sys.dont_write_bytecode
    sys.path.insert(0, str(folder))
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.path[:] = saved
        sys.dont_write_bytecode = saved_bytecode


def model_folder(spec: str) -> AbstractContextManager[None]:
    """The folder of model file ``spec`` (the working folder for a ``pkg.module``) first on
    ``sys.path``: for the whole scan, so that imports inside ``build_model()`` or ``forward``
    find the model's siblings."""
    path = Path(spec)
    if spec.endswith(".py") or _exists(path, spec):
        return folder_on_path(path.resolve().parent)
    return folder_on_path(Path.cwd())


@contextmanager
def own_argv(argv0: str) -> Iterator[None]:
    """``sys.argv`` as the model file would see it when run as a script (not our arguments)."""
    saved = sys.argv
    sys.argv = [argv0]
    try:
        yield
    finally:
        sys.argv = saved


def forget_stale_modules(folder: Path) -> None:
    """Drop from ``sys.modules`` the user's modules an earlier import left there that an import
    from ``folder`` would find: those inside it, and those named like a package or module in it
    but loaded from elsewhere. A scan then imports the files as they are now (after ``--fix``,
    or another project with a package of the same name); installed packages and nan_hunter's
    own modules are kept."""
    from nan_hunter.project.paths import is_installed

    own = Path(__file__).resolve().parents[1]
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name.startswith("nan_hunter") or is_installed(file):
            continue
        try:
            resolved = Path(file).resolve()
        except OSError:
            continue
        if resolved.is_relative_to(own):
            continue
        top = name.split(".")[0]
        shadowed = (folder / top).is_dir() or (folder / f"{top}.py").is_file()
        if resolved.is_relative_to(folder) or shadowed:
            del sys.modules[name]


def import_user_module(spec: str, search: Path | None = None) -> ModuleType:
    """Import a file path (``models/net.py``) or a dotted module name (``pkg.net``)."""
    path = Path(spec)
    if spec.endswith(".py") or _exists(path, spec):
        check_model_file(spec)
        _check_source(path, spec)
        path = path.resolve()
        forget_stale_modules(path.parent)
        name = _module_name(path)
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise LoadError(f"cannot import {spec}: not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            with folder_on_path(path.parent), own_argv(str(path)):
                _run_user(lambda: module_spec.loader.exec_module(module), f"importing {spec}", spec)  # type: ignore[union-attr]
        except UserCodeError as exc:
            sys.modules.pop(name, None)
            hint = _relative_import_hint(path, exc)
            if hint is None:
                raise
            raise UserCodeError(f"{exc.args[0]}; {hint}", user_frame=exc.user_frame) from exc
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    folder = search or Path.cwd()
    forget_stale_modules(folder)
    with folder_on_path(folder), own_argv(spec):
        try:
            return _run_user(lambda: importlib.import_module(spec), f"importing {spec}")
        except UserCodeError as exc:
            missing = exc.__cause__
            if isinstance(missing, ModuleNotFoundError) and missing.name and (
                spec == missing.name or spec.startswith(missing.name + ".")
            ):
                raise LoadError(f"model file or module not found: {spec}") from None
            raise


def _relative_import_hint(path: Path, exc: UserCodeError) -> str | None:
    """For a model file that is a module of a package (its relative imports need the package):
    how to scan it as one, as ``python -m`` runs it."""
    cause = exc.__cause__
    if not isinstance(cause, ImportError) or "no known parent package" not in str(cause):
        return None
    parts, folder = [path.stem], path.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    if len(parts) == 1:
        return "a file with relative imports is a module of a package: name it as pkg.module"
    return (
        f"{path.name} is a module of the package {'.'.join(parts[:-1])}: scan it as "
        f"`nan-hunter scan {'.'.join(parts)}` from {folder}"
    )


_OWN_NAMES = False
"""Set in the scan process (``use_own_module_names``), which ends with its scan. The Python API
runs in the caller's process, whose later ``import models`` must find its own ``models``, not
a scanned file: there model files keep internal names."""


def use_own_module_names() -> None:
    """Import model files under their own names from now on (the scan process)."""
    global _OWN_NAMES
    _OWN_NAMES = True


def _module_name(path: Path) -> str:
    """The name a model file is imported under: in the scan process its own (``model`` for
    ``model.py``), as ``import model`` gives it, so that a process the model starts by the
    spawn or forkserver method (a DataLoader's workers, by default on macOS) can import it to
    unpickle the model's objects; an internal name in a caller's process, or when that one is
    taken (an imported or built-in module) or is not a module name."""
    stem = path.stem
    free = (
        _OWN_NAMES
        and stem.isidentifier()
        and not keyword.iskeyword(stem)
        and stem not in sys.modules
        and not _importable_elsewhere(stem, path)
    )
    return stem if free else f"_nan_hunter_user_{stem}_{abs(hash(str(path))) & 0xFFFFFF:06x}"


def _importable_elsewhere(name: str, path: Path) -> bool:
    """Whether ``import name`` would find another module than ``path`` (a built-in or frozen
    module, an installed package or one of the standard library's not imported yet: ``yaml``,
    ``test``): the model file must not take its name, or whatever imports it later in the scan
    process (nan-hunter, torch, the model's own libraries) would get the model file instead."""
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken finder or package: keep away from the name
        return True
    if found is None:
        return False
    origin = found.origin
    return origin is None or Path(origin).resolve() != path


def _exists(path: Path, spec: str) -> bool:
    """``path.exists()``; a path the system cannot look at (a name too long, a folder the user
    may not enter) is a ``LoadError`` that says why, not a module name to import."""
    try:
        return path.exists()
    except OSError as exc:
        raise LoadError(f"cannot read {spec}: {exc.strerror or exc}") from None


def _run_user(action: Callable[[], Any], what: str, file: str | None = None) -> Any:
    activity.note(what)
    try:
        return action()
    except SyntaxError as exc:
        where = f"{exc.filename or file or '?'}" + (f":{exc.lineno}" if exc.lineno else "")
        raise LoadError(f"syntax error in {where}: {exc.msg}") from exc
    except NOT_THE_MODELS:
        raise
    except BaseException as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        user = next((f for f in reversed(frames) if frame_origin(f.filename) == "user"), None)
        where = f"{user.filename}:{user.lineno}" if user else None
        raise UserCodeError(
            f"{type(exc).__name__} while {what}: {first_line(exc)}", user_frame=where
        ) from exc


def _check_source(path: Path, spec: str) -> None:
    """A model file is text: a binary file gets a clear line, not a confusing syntax error."""
    try:
        with path.open("rb") as source:
            head = source.read(1 << 16)
    except OSError as exc:
        raise LoadError(f"cannot read model file {spec}: {exc.strerror or exc}") from exc
    if b"\0" in head:
        raise LoadError(f"{spec} is not a Python source file (it holds binary data)")


def _function(module: ModuleType, name: str, flag: str, *, required: bool) -> Any:
    """``module.name``, checked to be callable; ``flag`` is the option that renames it."""
    where = Path(module.__file__).name if module.__file__ else module.__name__
    value = getattr(module, name, None)
    if value is None:
        if required:
            raise LoadError(
                f"{where} defines no {name}(); define it or name another function with {flag}"
            )
        return None
    if not callable(value):
        raise LoadError(f"{name} in {where} is a {type(value).__name__}, not a function")
    return value


def _call_user(func: Callable[[], Any], name: str) -> Any:
    return _run_user(func, f"calling {name}()")


def load_tensors(path: Path, *, what: str) -> Any:
    """A tensor, a state_dict or a nest of tensors, loaded without running pickled code."""
    if path.is_dir():
        raise LoadError(f"{what} file {path} is a folder")
    if not path.is_file():
        raise LoadError(f"{what} file not found: {path}")
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError as exc:
            raise LoadError(f"{path} is a .safetensors file; pip install safetensors") from exc
        try:
            with _no_warnings():
                return load_file(str(path))
        except Exception as exc:
            raise LoadError(f"cannot read {what} file {path}: {exc}") from exc
    try:
        with _no_warnings():
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise LoadError(
            f"cannot load {what} file {path} safely (weights_only=True): {first_line(exc)}"
        ) from exc


@contextmanager
def _no_warnings() -> Iterator[None]:
    """Around a load of ours: torch's warnings about the file ("Detected pickle protocol 4",
    on garbage bytes too) are neither the model's output nor news to the user; the load
    either works or fails with one error line that says why."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _wrapper_prefix(state: Mapping[str, Any]) -> str | None:
    """``module.`` or ``_orig_mod.`` when every key of ``state`` starts with it."""
    for prefix in ("module.", "_orig_mod."):
        if state and all(isinstance(k, str) and k.startswith(prefix) for k in state):
            return prefix
    return None


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load a state_dict into ``model``. For a wrapped model (``torch.compile``, DataParallel),
    the state_dict may be the wrapper's (``_orig_mod.``/``module.`` prefixes) or the original
    module's: it goes into whichever has exactly its keys."""
    state = load_tensors(path, what="weights")
    if not isinstance(state, dict):
        raise LoadError(f"weights file {path} holds a {type(state).__name__}, not a state_dict")
    chain = [model]
    while (inner := _wrapped(chain[-1])) is not None and len(chain) < 8:
        chain.append(getattr(chain[-1], inner[0]))
    fits = [set(m.state_dict()) for m in chain]
    # A checkpoint saved from a wrapper (DDP: "module.", torch.compile: "_orig_mod.") into a
    # plain model: the wrapper's prefixes go when the keys then fit exactly.
    while set(state) not in fits and (prefix := _wrapper_prefix(state)) is not None:
        stripped = {k.removeprefix(prefix): v for k, v in state.items()}
        if not any(set(stripped) <= f for f in fits) and _wrapper_prefix(stripped) is None:
            break
        state = stripped
    keys = set(state)
    model = next((m for m in chain if set(m.state_dict()) == keys), model)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])
        raise LoadError(f"weights file {path} does not fit the model: {detail}") from exc
