"""The reproduction bundle of a problem step: a folder that ``nan-hunter scan`` re-runs in a
fresh process, without the training script's loop.

    nan-hunter-repro-step12/
      model.py         build_model(), sample_batch() (and loss_fn) for `nan-hunter scan`
      weights.pt       the model's state_dict as the step ran with it (before its update)
      batch.pt         the model call's real inputs: a tuple (positional) or a dict (keywords)
      grads.pt         the gradient that reached each output, and the loss scale (when kept)
      state.pt         the module tree's classes and plain attributes, RNG states, the scale
      nan-hunter.yaml  the re-run's settings (dtype, mode, device, policy, grad_scale)

Every ``.pt`` file holds tensors and plain data only: ``torch.load(..., weights_only=True)``
reads it, and ``scan --weights weights.pt --batch-file batch.pt`` takes the first two with a
model file of the user's own. ``model.py`` imports the model's classes from the user's project
(the script's own classes from the script's definitions, its training left out: see
``repro_load``), by paths relative to the bundle, so a copy of the project with the bundle in it
reproduces too. The model is rebuilt without calling its ``__init__`` (whose arguments are not
known): each module's class, its plain attributes (numbers, strings, tuples, dtypes,
importable functions and classes, objects of importable classes made of those), then its
parameters and buffers from ``weights.pt``. What cannot be written so is named
(``Bundle.left_out``).

``plan_bundle`` gathers it all by reference (no copy) at the problem step, before the update;
``write_bundle`` writes the folder whole or not at all (``safe_write.write_new_folder``), or
nothing when it would exceed the size cap.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from nan_hunter.core.safe_write import new_folder_name, write_new_folder
from nan_hunter.errors import NanHunterError
from nan_hunter.findings import ReproBundle
from nan_hunter.project.config import Settings
from nan_hunter.training.rerun import (
    ModelCall,
    OutputGradientLoss,
    precision_settings,
    rng_dict,
)

MARK = "__nan_hunter__"
"""The key that marks an encoded value (a reference, an object, an enum member) in state.pt."""
MAX_DEPTH = 12
MODULE_INTERNALS = frozenset((
    "_parameters", "_buffers", "_modules", "_forward_pre_hooks", "_forward_hooks",
    "_backward_pre_hooks", "_backward_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_is_full_backward_hook",
    "_compiled_call_impl",
))
"""A module's own bookkeeping, made anew by ``nn.Module.__init__`` when it is rebuilt."""
PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
         torch.Size)


class ReproError(NanHunterError):
    """The bundle could not be made (what the step's call holds cannot be saved safely)."""


@dataclass(frozen=True)
class ReproSource:
    """What a bundle is made of, by reference, taken at the problem step before its update."""

    step: int
    module: torch.nn.Module
    """The plain model the step called (a DDP or ``torch.compile`` wrapper taken off)."""
    call: ModelCall
    scale: float | None
    settings: Settings
    """The re-run's settings, in the step's precision."""
    script: str
    """The script's file (``-m``: the module's), whose classes ``__main__`` names."""

    @classmethod
    def of(cls, step: int, module: torch.nn.Module, call: ModelCall, scale: float | None,
           settings: Settings, precision_given: frozenset[str]) -> ReproSource:
        """The settings derived as ``rerun.rerun_call`` derives them."""
        settings = dataclasses.replace(settings, grad_scale=scale)
        settings = precision_settings(settings, call.precision, precision_given)
        if settings.mode == "half":
            settings = dataclasses.replace(settings, grad_scale=None)
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None) or ""
        return cls(step, module, call, scale, settings, os.path.abspath(script) if script else "")


@dataclass(frozen=True)
class Plan:
    """The files of a bundle, not yet written, and what they hold."""

    files: tuple[tuple[str, Any], ...]
    """(name, object for ``torch.save``, or str for a text file)."""
    estimate: int
    """Bytes of the tensors in it (the files are a little larger)."""
    left_out: tuple[str, ...]


def default_folder(step: int, where: Path) -> Path:
    """``nan-hunter-repro-stepN`` in ``where``, numbered when that name is taken."""
    return new_folder_name(where / f"nan-hunter-repro-step{step}")


def plan_bundle(source: ReproSource, folder: Path) -> Plan:
    """The bundle's files for ``folder`` (where ``model.py`` will be, for its relative paths)."""
    module = source.module
    weights = {k: _saveable(v) for k, v in module.state_dict(keep_vars=False).items()}
    structure, extra, left_out, classes = _structure(module)
    batch = _batch(source.call)
    grads: dict[str, Any] | None = None
    if OutputGradientLoss(source.call.grads, source.scale).usable:
        grads = {"grads": {i: _saveable(g) for i, g in source.call.grads.items()},
                 "scale": source.scale}
    state = {"format": 1, "step": source.step, "structure": structure, "buffers": extra,
             "rng": rng_dict(source.call.rng), "grad_scaler": {"scale": source.scale},
             "left_out": list(left_out)}
    files: list[tuple[str, Any]] = [
        ("weights.pt", weights), ("batch.pt", batch), ("state.pt", state),
    ]
    if grads is not None:
        files.append(("grads.pt", grads))
    files.append(("nan-hunter.yaml", _settings_yaml(source.settings)))
    files.append(("model.py", model_file(source, folder, classes, left_out, grads is not None)))
    estimate = _tensor_bytes([weights, batch, grads, state])
    return Plan(tuple(files), estimate, tuple(left_out))


def write_bundle(source: ReproSource, folder: Path | None, max_mb: float,
                 where: Path) -> ReproBundle:
    """Write the bundle into ``folder`` (None: a new ``default_folder`` in ``where``), unless it
    would exceed ``max_mb`` MB (2**20 bytes): then nothing is written and the result says why."""
    max_bytes = max_mb * 2**20
    target = folder if folder is not None else default_folder(source.step, where)
    try:
        plan = plan_bundle(source, target.resolve())
    except ReproError as exc:
        return ReproBundle(str(target), 0, written=False, note=str(exc))
    if plan.estimate > max_bytes:
        return ReproBundle(
            str(target), plan.estimate, written=False,
            note=f"it would hold {megabytes(plan.estimate)}, over --repro-max-mb "
                 f"{max_mb:g}: nothing written",
        )
    size = write_new_folder(target, [(name, _writer(obj)) for name, obj in plan.files])
    note = ("left out (not plain data; edit build_model() if the forward needs them): "
            + ", ".join(plan.left_out)) if plan.left_out else ""
    return ReproBundle(str(target), size, written=True, note=note)


def megabytes(size: int) -> str:
    """``1.2 MB`` (2**20 bytes), ``33 KB`` below a tenth of one."""
    return f"{size / 2**20:.1f} MB" if size >= 2**20 / 10 else f"{max(1, round(size / 1024))} KB"


def _writer(obj: Any) -> Callable[[BinaryIO], None]:
    if isinstance(obj, str):
        data = obj.encode()
        return lambda out: out.write(data) and None
    return lambda out: torch.save(obj, out)


def _saveable(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached; a view is copied (``torch.save`` would write its whole storage)."""
    t = t.detach()
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        t = t.clone()
    return t


def _tensor_bytes(objs: list[Any]) -> int:
    seen: dict[int, int] = {}

    def visit(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            seen[storage.data_ptr() or id(storage)] = storage.nbytes()
        elif isinstance(x, Mapping):
            for v in x.values():
                visit(v)
        elif isinstance(x, (list, tuple, set)):
            for v in x:
                visit(v)

    for obj in objs:
        visit(obj)
    return sum(seen.values())


# ------------------------------------------------------------------ the model call's inputs


def _batch(call: ModelCall) -> Any:
    """The call's inputs as ``--batch-file`` takes them: a tuple (positional only), a dict
    (keywords only, or positional ones bound to the forward's parameter names)."""
    args = _plain_batch(call.args)
    kwargs = _plain_batch(call.kwargs)
    if not kwargs:
        return tuple(args)
    if not args:
        return dict(kwargs)
    try:
        bound = inspect.signature(call.module.forward).bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ReproError(f"the model call's inputs cannot be saved: {exc}") from None
    kinds = inspect.signature(call.module.forward).parameters
    if any(kinds[name].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)
           for name in bound.arguments):
        raise ReproError("the model call's positional inputs cannot be named: its forward "
                         "takes them positionally only")
    named = dict(bound.arguments)
    for name in list(named):
        if kinds[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(named.pop(name))
    return named


def _plain_batch(value: Any, depth: int = 0) -> Any:
    """The inputs as tensors and plain data (a mapping as a dict, a named tuple as a tuple)."""
    if depth > MAX_DEPTH:
        raise ReproError("the model call's inputs are nested too deeply to save")
    if isinstance(value, torch.Tensor):
        return _saveable(value)
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, Mapping):
        return {k: _plain_batch(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain_batch(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    raise ReproError(f"the model call's inputs hold a {type(value).__name__}, which is not "
                     "saved (tensors, numbers, strings, lists, tuples and dicts are)")


# ------------------------------------------------------------------ the module tree


def _structure(
    root: torch.nn.Module,
) -> tuple[dict[str, Any], dict[str, torch.Tensor], list[str], set[str]]:
    """The module tree as data: per module (by its name in ``named_modules``) its class, its
    plain attributes, its parameters and buffers (their names in ``weights.pt``), its children;
    the non-persistent buffers (not in the state_dict); what was left out; the modules whose
    classes it names."""
    names = {id(m): name for name, m in root.named_modules()}
    first = {id(p): name for name, p in root.named_parameters()}
    first_buffer = {id(b): name for name, b in root.named_buffers()}
    state_keys = set(root.state_dict().keys())
    classes: set[str] = set()
    left_out: list[str] = []
    extra: dict[str, torch.Tensor] = {}
    modules: dict[str, Any] = {}
    for name, module in root.named_modules():
        cls = type(module)
        classes.add(cls.__module__)
        attrs: dict[str, Any] = {}
        for key, value in module.__dict__.items():
            if key in MODULE_INTERNALS:
                continue
            where = f"{cls.__qualname__}.{key}" + (f" ({name})" if name else "")
            encoded = _encode(value, classes, 0)
            if encoded is _MISSING:
                left_out.append(f"{where} (a {type(value).__name__})")
                continue
            attrs[key] = encoded
        buffers: dict[str, str | None] = {}
        for key, buffer in module._buffers.items():
            if buffer is None:
                buffers[key] = None
                continue
            full = first_buffer[id(buffer)]
            buffers[key] = full
            if full not in state_keys:
                extra[full] = _saveable(buffer)
        modules[name] = {
            "class": (cls.__module__, cls.__qualname__),
            "attrs": attrs,
            "params": {k: None if p is None else (first[id(p)], p.requires_grad)
                       for k, p in module._parameters.items()},
            "buffers": buffers,
            "children": {k: None if m is None else names[id(m)]
                         for k, m in module._modules.items()},
        }
    return {"root": "", "modules": modules}, extra, left_out, classes


class _Missing:
    pass


_MISSING = _Missing()


def _encode(value: Any, classes: set[str], depth: int) -> Any:
    """``value`` as data ``torch.load(weights_only=True)`` reads back, or ``_MISSING``."""
    if depth > MAX_DEPTH:
        return _MISSING
    if isinstance(value, torch.Tensor):
        return _saveable(value) if type(value) in (torch.Tensor, torch.nn.Parameter) else _MISSING
    if isinstance(value, enum.Enum):
        ref = _reference(type(value), classes)
        return _MISSING if ref is None else {MARK: "enum", "class": ref, "name": value.name}
    if isinstance(value, PLAIN):
        return value
    if type(value) in (list, tuple, set, frozenset):
        items = [_encode(v, classes, depth + 1) for v in value]
        if any(i is _MISSING for i in items):
            return _MISSING
        return items if type(value) is list else tuple(items) if type(value) is tuple else (
            {MARK: "set", "items": items, "frozen": type(value) is frozenset})
    if type(value) is dict or (isinstance(value, dict) and type(value).__module__ == "collections"):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                return _MISSING
            out[k] = _encode(v, classes, depth + 1)
            if out[k] is _MISSING:
                return _MISSING
        return out
    if inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
        ref = _reference(value, classes)
        return _MISSING if ref is None else {MARK: "ref", "ref": ref}
    if isinstance(value, torch.nn.Module):
        return _MISSING  # a module outside the tree (a reference kept in __dict__)
    state = getattr(value, "__dict__", None)
    ref = _reference(type(value), classes)
    if ref is None or not isinstance(state, dict) or hasattr(type(value), "__slots__"):
        return _MISSING
    encoded = _encode(dict(state), classes, depth + 1)
    return _MISSING if encoded is _MISSING else {MARK: "object", "class": ref, "state": encoded}


def _reference(obj: Any, classes: set[str]) -> tuple[str, str] | None:
    """(module, qualname) of a function or class that importing its module gives back."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        return None
    classes.add(module)
    return (module, qualname)


# ------------------------------------------------------------------ the files that are text


def _settings_yaml(settings: Settings) -> str:
    import yaml

    keys = ("dtype", "mode", "device", "policy", "numerics", "grad_scale")
    values = {k: getattr(settings, k) for k in keys}
    return ("# The settings of nan-hunter run's re-run of this step: `nan-hunter scan model.py`\n"
            "# reads them here (flags still override them).\n"
            + yaml.safe_dump(values, sort_keys=False))


def _relative(path: Path, folder: Path) -> str:
    try:
        return Path(os.path.relpath(path, folder)).as_posix()
    except ValueError:  # another drive
        return path.as_posix()


def _import_roots(modules: set[str], script: str) -> list[str]:
    """The folders the project's modules are imported from: the script's folder, and for each
    module loaded from a file below it or the working directory, the folder its dotted name
    starts in (``pkg/models.py`` as ``pkg.models``: the folder holding ``pkg``)."""
    project = [Path(script).parent] if script else []
    project.append(Path.cwd())
    roots: list[str] = [str(project[0])] if script else []
    for name in sorted(modules):
        file = getattr(sys.modules.get(name), "__file__", None)
        if name == "__main__" or not file:
            continue
        path = Path(file).resolve()
        if not any(path.is_relative_to(p.resolve()) for p in project):
            continue  # an installed package: imported by name
        depth = name.count(".") + (1 if path.name == "__init__.py" else 0)
        root = str(path.parents[depth])
        if root not in roots:
            roots.append(root)
    return roots


def model_file(source: ReproSource, folder: Path, modules: set[str], left_out: list[str],
               has_grads: bool) -> str:
    """``model.py``: ``build_model``/``sample_batch`` (and ``loss_fn``) over the bundle's files."""
    call_class = type(source.module)
    script = _relative(Path(source.script), folder) if source.script else ""
    roots = [_relative(Path(r), folder) for r in _import_roots(modules, source.script)]
    lines = [
        f'"""A reproduction of training step {source.step}, written by `nan-hunter run`.',
        "",
        f"    nan-hunter scan {folder.name}/model.py",
        f"    nan-hunter scan YOUR_MODEL_FILE.py --weights {folder.name}/weights.pt "
        f"--batch-file {folder.name}/batch.pt",
        "",
        f"The model is {call_class.__qualname__} (from {call_class.__module__}"
        + (f", the script {Path(source.script).name}" if call_class.__module__ == "__main__"
           else "") + "), rebuilt",
        "from state.pt and weights.pt without calling its __init__; its inputs are batch.pt;",
        ("the backward is driven by the gradients that reached its outputs (grads.pt)."
         if has_grads else "the scan's default loss drives the backward (no finite output "
         "gradient was kept)."),
    ]
    if left_out:
        lines += ["", "Not kept (not plain data); set them in build_model() if the forward "
                  "needs them:", *(f"    {item}" for item in left_out)]
    lines += [
        '"""',
        "",
        "from pathlib import Path",
        "",
        "from nan_hunter.training.repro_load import Bundle",
        "",
        "HERE = Path(__file__).resolve().parent",
        "BUNDLE = Bundle(",
        "    HERE,",
        f"    script={'HERE / ' + repr(script) if script else 'None'},",
        f"    roots=[{', '.join('HERE / ' + repr(r) for r in roots)}],",
        f"    modules={tuple(sorted(modules))!r},",
        ")",
        "",
        "",
        "def build_model():",
        "    return BUNDLE.model()",
        "",
        "",
        "def sample_batch():",
        "    return BUNDLE.batch()",
    ]
    if has_grads:
        lines += ["", "", "def loss_fn(output, batch):", "    return BUNDLE.loss(output, batch)"]
    return "\n".join(lines) + "\n"
