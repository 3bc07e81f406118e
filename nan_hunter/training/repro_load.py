"""What a reproduction bundle's ``model.py`` calls (``training.repro`` writes the bundle).

    BUNDLE = Bundle(HERE, script=HERE / "../train.py", roots=[HERE / ".."],
                    modules=("__main__", "torch.nn.modules.linear"))
    model = BUNDLE.model()      # the module tree of state.pt, the weights of weights.pt
    batch = BUNDLE.batch()      # batch.pt; torch's RNG set to the state the call started in

The ``.pt`` files are read with ``torch.load(..., weights_only=True)``. Classes are imported
only from the modules ``model.py`` names: ``__main__`` is the training script, of which only
the definitions run (imports, functions, classes, assignments that call nothing: its training
loop does not run again), under the script's own file name so that findings point into it.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from nan_hunter.errors import LoadError

MARK = "__nan_hunter__"
SCRIPT_MODULE = "__nan_hunter_repro_script__"


class Bundle:
    """A bundle's folder, the script whose definitions ``__main__`` names, the folders the
    project's modules are imported from, and the modules classes may come from."""

    def __init__(self, folder: Path, *, script: Path | None, roots: Sequence[Path],
                 modules: Sequence[str]) -> None:
        self.folder = Path(folder)
        self.script = script
        self.roots = [str(Path(r).resolve()) for r in roots]
        self.modules = frozenset(modules)
        self._loaded: dict[str, Any] = {}
        self._loss: Callable[[Any, Any], torch.Tensor] | None = None

    def load(self, name: str) -> Any:
        return torch.load(self.folder / name, map_location="cpu", weights_only=True)

    def model(self) -> torch.nn.Module:
        state = self.load("state.pt")
        weights = self.load("weights.pt")
        return rebuild(state["structure"], weights, state.get("buffers", {}), self.resolve)

    def batch(self) -> Any:
        batch = self.load("batch.pt")
        rng = self.load("state.pt").get("rng")
        if rng:
            torch.random.set_rng_state(rng["cpu"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"])
        return batch

    def loss(self, output: Any, batch: Any) -> torch.Tensor:
        if self._loss is None:
            from nan_hunter.training.rerun import OutputGradientLoss

            saved = self.load("grads.pt")
            self._loss = OutputGradientLoss(saved["grads"], saved["scale"])
        return self._loss(output, batch)

    def resolve(self, ref: Sequence[str]) -> Any:
        """The object ``(module, qualname)`` names, from a module ``model.py`` allows."""
        module_name, qualname = ref
        if module_name not in self.modules:
            raise LoadError(f"state.pt names {module_name}.{qualname}, from a module model.py "
                            "does not list")
        found: Any = self._module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if found is None:
            raise LoadError(f"{qualname} is no longer defined in {module_name}")
        return found

    def _module(self, name: str) -> Any:
        if name not in self._loaded:
            if name == "__main__":
                if self.script is None:
                    raise LoadError("the bundle names the script's classes but not the script")
                self._loaded[name] = script_definitions(Path(self.script))
            else:
                for root in reversed(self.roots):
                    if root not in sys.path:
                        sys.path.insert(0, root)
                self._loaded[name] = importlib.import_module(name)
        return self._loaded[name]


def script_definitions(file: Path) -> types.ModuleType:
    """The script's definitions only (its training not run), as a module; line numbers and the
    file name stay the script's."""
    from nan_hunter.fixes.in_memory import _is_definition

    file = file.resolve()
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (OSError, SyntaxError, ValueError) as exc:
        raise LoadError(f"cannot read the training script {file}: {exc}") from exc
    tree.body = [node for node in tree.body if _is_definition(node)]
    module = types.ModuleType(SCRIPT_MODULE)
    module.__file__ = str(file)
    sys.modules[SCRIPT_MODULE] = module
    folder = str(file.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    exec(compile(tree, str(file), "exec"), module.__dict__)
    return module


def rebuild(structure: dict[str, Any], weights: dict[str, torch.Tensor],
            buffers: dict[str, torch.Tensor], resolve: Callable[[Sequence[str]], Any]
            ) -> torch.nn.Module:
    """The module tree ``structure`` describes, each module made without its ``__init__``,
    its parameters (tied ones tied) from ``weights``, its buffers from ``weights`` or
    ``buffers`` (the non-persistent ones)."""
    specs: dict[str, Any] = structure["modules"]
    made: dict[str, torch.nn.Module] = {}
    for name, spec in specs.items():
        cls = resolve(spec["class"])
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        made[name] = module
    params: dict[str, torch.nn.Parameter] = {}
    for name, spec in specs.items():
        module = made[name]
        module.__dict__.update({k: decode(v, resolve) for k, v in spec["attrs"].items()})
        for key, saved in spec["params"].items():
            if saved is None:
                module._parameters[key] = None
                continue
            full, requires_grad = saved
            if full not in params:
                params[full] = torch.nn.Parameter(weights[full], requires_grad=requires_grad)
            module._parameters[key] = params[full]
        for key, full in spec["buffers"].items():
            module._buffers[key] = None if full is None else (
                weights[full] if full in weights else buffers[full])
        for key, child in spec["children"].items():
            module._modules[key] = None if child is None else made[child]
    return made[structure["root"]]


def decode(value: Any, resolve: Callable[[Sequence[str]], Any]) -> Any:
    """A value ``training.repro._encode`` wrote."""
    if isinstance(value, list):
        return [decode(v, resolve) for v in value]
    if isinstance(value, tuple):
        return tuple(decode(v, resolve) for v in value)
    if not isinstance(value, dict):
        return value
    kind = value.get(MARK)
    if kind is None:
        return {k: decode(v, resolve) for k, v in value.items()}
    if kind == "ref":
        return resolve(value["ref"])
    if kind == "enum":
        return resolve(value["class"])[value["name"]]
    if kind == "set":
        items = [decode(v, resolve) for v in value["items"]]
        return frozenset(items) if value["frozen"] else set(items)
    if kind == "object":
        cls = resolve(value["class"])
        obj = cls.__new__(cls)
        obj.__dict__.update(decode(value["state"], resolve))
        return obj
    raise LoadError(f"state.pt holds a value of an unknown kind {kind!r}")
