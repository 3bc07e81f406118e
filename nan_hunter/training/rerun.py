"""The re-run of one real model call, as ``nan-hunter run`` saw it in a training step.

A ``ModelCall`` is the outermost call of a model in a step: its ``args``/``kwargs`` (the
real inputs, by reference), the precision it ran under (autocast on or off, its dtype, the
parameters' dtype) and, once the backward has run, the gradient that arrived at each of its
floating outputs. The re-run calls a copy of the model with the very same inputs and drives the
traced backward with those gradients: its loss is ``sum(output_i * grad_i)``, whose gradient
with respect to each output is the real one, so no loss function is guessed (when the real
gradient is not finite anywhere, as after a NaN loss, the scan's default loss is used).

    call = ModelCall(model, args, kwargs, StepPrecision.now(model, args))
    call.watch_outputs(output)                         # in the forward hook
    ...                                                # the script's backward fills call.grads
    report = rerun_call(call, replay_copy(model), settings, scale=65536.0)
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from nan_hunter.core.batch import Batch
from nan_hunter.core.nest import leaves, output_leaves
from nan_hunter.engine.pass_state import RngState, compared_passes_from
from nan_hunter.findings import Report
from nan_hunter.project.config import Settings
from nan_hunter.trace import torch_originals as real

MAX_GRAPH_NODES = 200_000
"""Autograd nodes walked, per output, to find outputs computed from other outputs."""


@dataclass(frozen=True)
class StepPrecision:
    """How a model call ran: autocast on its device (and the dtype), the parameters' dtype."""

    device: str
    autocast: bool
    autocast_dtype: torch.dtype | None
    param_dtype: torch.dtype | None

    @classmethod
    def now(cls, module: torch.nn.Module, args: tuple[Any, ...]) -> StepPrecision:
        first = next(module.parameters(), None)
        if first is None:
            first = next((x for x in leaves(args) if isinstance(x, torch.Tensor)), None)
        device = first.device.type if first is not None else "cpu"
        on = torch.is_autocast_enabled(device)
        return cls(
            device=device, autocast=on,
            autocast_dtype=torch.get_autocast_dtype(device) if on else None,
            param_dtype=first.dtype if first is not None and first.is_floating_point() else None,
        )

    def options(self, fp32: bool = True) -> dict[str, Any]:
        """The scan settings that model this precision; an FP32 step as FP32 with ``fp32``,
        else with the configured dtype (an FP32 run standing in for an FP16 one)."""
        if self.autocast and self.autocast_dtype in (torch.float16, torch.bfloat16):
            name = "float16" if self.autocast_dtype == torch.float16 else "bfloat16"
            return {"dtype": name, "mode": "autocast", "device": self.device}
        if self.param_dtype in (torch.float16, torch.bfloat16):
            name = "float16" if self.param_dtype == torch.float16 else "bfloat16"
            return {"dtype": name, "mode": "half", "device": self.device}
        if fp32 and self.param_dtype == torch.float32:  # its NaN is analysed in FP32
            return {"dtype": "float32", "mode": "half", "device": self.device}
        return {"device": self.device}


@dataclass(eq=False)
class ModelCall:
    """One outermost model call of a training step (mutable: the backward fills ``grads``)."""

    module: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    precision: StepPrecision
    grads: dict[int, torch.Tensor] = field(default_factory=dict)
    """Output leaf index (``_nest.output_leaves`` order) -> the gradient that reached that
    output."""
    outputs: int = 0
    """Floating outputs that require a gradient (each got a hook)."""
    values: list[torch.Tensor] = field(default_factory=list)
    """Those outputs, detached (kept until the step ends, to tell which call broke)."""
    rng: RngState | None = None
    """The random number generators' state when the call started (its dropout masks)."""
    versions: tuple[int, ...] = ()
    """The version counter of each input tensor when the call returned (in-place writes after
    it bump them: the re-run would read other data)."""

    def watch_outputs(self, output: Any) -> None:
        """A hook on each floating output that requires a gradient, keeping that gradient
        (tensors in tuples, lists, dicts, ``ModelOutput`` and plain dataclasses)."""
        for index, leaf in enumerate(output_leaves(output)):
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad and (
                leaf.is_floating_point()
            ):
                leaf.register_hook(_Keep(self.grads, index))
                self.values.append(leaf.detach())
                self.outputs += 1

    def finite(self) -> bool:
        """All outputs and kept output gradients finite (host syncs: on a problem only)."""
        return all(bool(real.isfinite(t).all()) for t in [*self.values, *self.grads.values()])


def rng_dict(state: RngState | None) -> dict[str, torch.Tensor]:
    """A call's generator state as plain tensors by name (what ``torch.load(...,
    weights_only=True)`` reads back): ``cpu``, and ``cuda`` (the current device's) when CUDA
    was initialised."""
    if state is None:
        return {}
    states = {"cpu": state[0]}
    if state[1]:
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        states["cuda"] = state[1][device if device < len(state[1]) else 0]
    return states


class _Keep:
    """A tensor hook storing the gradient under ``index`` (a class: no closure per output)."""

    __slots__ = ("grads", "index")

    def __init__(self, grads: dict[int, torch.Tensor], index: int) -> None:
        self.grads, self.index = grads, index

    def __call__(self, grad: torch.Tensor) -> None:
        self.grads[self.index] = grad


class OutputGradientLoss:
    """``loss_fn(output, batch)`` for the re-run: ``sum(output_i * g_i)`` over the outputs that
    got a gradient in the real step, with ``g_i`` that gradient divided by the loss scale the
    step ran with (the scan multiplies by it again). Non-finite entries of ``g_i`` are taken as
    0: the traced forward shows where they came from. An output computed from another kept
    output (a model returning its loss and the logits it came from) is left out: its gradient
    already holds the other's share."""

    def __init__(self, grads: dict[int, torch.Tensor], scale: float | None) -> None:
        divide = scale if scale else 1.0
        self.grads = {
            i: torch.nan_to_num(g.detach().float() / divide, nan=0.0, posinf=0.0, neginf=0.0)
            for i, g in grads.items()
        }

    @property
    def usable(self) -> bool:
        """Some kept gradient has a finite nonzero entry (not so when the loss was NaN)."""
        return any(bool(g.abs().sum() > 0) for g in self.grads.values())

    def __call__(self, output: Any, batch: Any) -> torch.Tensor:
        flat = list(output_leaves(output))
        used = {i: flat[i] for i in self.grads if i < len(flat)
                and isinstance(flat[i], torch.Tensor) and flat[i].requires_grad}
        used = {i: t for i, t in used.items() if not _upstream_of_another(t, used)}
        if not used:
            raise ValueError("the re-run's output has no tensor where the real step had one")
        terms = [
            (t.float() * self.grads[i].to(t.device).reshape(t.shape)).sum()
            for i, t in used.items()
        ]
        return torch.stack(terms).sum() if len(terms) > 1 else terms[0]


def _upstream_of_another(tensor: torch.Tensor, used: dict[int, torch.Tensor]) -> bool:
    node = tensor.grad_fn
    if node is None:
        return False
    return any(other is not tensor and _reaches(other.grad_fn, node) for other in used.values())


def _reaches(start: Any, target: Any) -> bool:
    seen: set[int] = set()
    stack = [start]
    while stack and len(seen) < MAX_GRAPH_NODES:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        if node is target:
            return True
        seen.add(id(node))
        stack.extend(n for n, _ in node.next_functions)
    return False


class KeepsCalls(Protocol):
    def keep_call(self, module: torch.nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any], output: Any) -> None: ...


class CallKeeper:
    """A model's forward hook (``register_forward_hook(keeper, with_kwargs=True)``) handing
    each call to ``owner.keep_call``, held by a weak reference. Deep copies of the model (the
    re-run's) share it rather than copying the owner with it."""

    def __init__(self, owner: KeepsCalls) -> None:
        self._owner = weakref.ref(owner)

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...],
                 kwargs: dict[str, Any], output: Any) -> None:
        owner = self._owner()
        if owner is not None:
            owner.keep_call(module, args, kwargs, output)

    def __deepcopy__(self, memo: dict[int, Any]) -> CallKeeper:
        return self


class KeeperHandle:
    """The handle of a ``CallKeeper``'s hook, told apart from an optimizer hook's."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def remove(self) -> None:
        self._handle.remove()


def pick_call(calls: list[ModelCall]) -> ModelCall | None:
    """The step's call to re-run: the first whose output or output gradient is not finite, else
    the last (host syncs: called on a problem only)."""
    if not calls:
        return None
    return next((c for c in calls if not c.finite()), calls[-1])


PRECISION_KEYS = ("dtype", "mode", "device")


def precision_settings(
    settings: Settings,
    precision: StepPrecision,
    given: frozenset[str] | None = None,
    *,
    fp32: bool = True,
) -> Settings:
    """``settings`` in the precision a call ran under (an FP32 call as FP32 with ``fp32``); a
    key in ``given`` (None: those set explicitly in ``settings``) is kept as it is."""
    from nan_hunter.project.options import explicitly_set

    changes = {
        k: v for k, v in precision.options(fp32).items()
        if (k not in given if given is not None else not explicitly_set(settings, k))
    }
    if changes.get("mode") == "half" and not explicitly_set(settings, "grad_scale"):
        changes["grad_scale"] = None  # GradScaler does not unscale FP16 gradients
    return dataclasses.replace(settings, **changes)


def rerun_call(
    call: ModelCall,
    replay: torch.nn.Module,
    settings: Settings,
    *,
    scale: float | None,
    precision_given: frozenset[str] = frozenset(),
    step_rng: bool = False,
) -> Report:
    """Scan ``replay`` (a copy of ``call.module`` with the weights the step ran with) on the
    call's own inputs, in the precision the step ran under (unless a setting named in
    ``precision_given`` was set by the user), the backward driven by the real output
    gradients (the scan's own default loss when none was kept), at the step's loss scale. Its
    fixes name the device of the tensors they take (``fix_device: input``) unless
    ``fix_device`` was set. With ``step_rng`` the re-run starts from the random number
    generators' state of the call (the same dropout masks), the script's put back after it."""
    from nan_hunter.api import scan
    from nan_hunter.project.options import explicitly_set

    settings = dataclasses.replace(settings, grad_scale=scale)
    settings = precision_settings(settings, call.precision, precision_given)
    if not explicitly_set(settings, "fix_device"):
        # a patch of the script's own code: it must switch off the autocast the script runs
        # (CPU or GPU), not the one the policy predicts; the same code is what verification
        # re-runs, under the emulation too
        settings = dataclasses.replace(settings, fix_device="input")
    if settings.mode == "half":
        settings = dataclasses.replace(settings, grad_scale=None)
    batch = Batch(args=call.args, kwargs=call.kwargs, raw=(call.args, call.kwargs))
    loss_fn = OutputGradientLoss(call.grads, scale)
    if not step_rng or call.rng is None:
        return scan(replay, batch, loss_fn if loss_fn.usable else None, settings=settings)
    with compared_passes_from(call.rng):  # the step's own dropout masks
        return scan(replay, batch, loss_fn if loss_fn.usable else None, settings=settings)


MAX_GRAPH_NODES = 200_000
"""The autograd nodes ``reaches_parameters`` looks at before it gives up (None)."""


def reaches_parameters(loss: torch.Tensor, params: list[torch.Tensor]) -> bool | None:
    """Whether the backward graph of ``loss`` reaches one of ``params`` (the watched model's
    leaves): False when the graph reaches other leaves and none of those; None when there is
    no graph to read (a detached loss) or it is larger than ``MAX_GRAPH_NODES``. The graph's
    structure outlives its backward (only the saved tensors are freed), so this reads a loss
    after ``loss.backward()`` too. Iterative: a graph as deep as the model costs no stack."""
    root = loss.grad_fn
    if root is None:
        return None
    wanted = {id(p) for p in params}
    seen: set[int] = set()
    stack = [root]
    found = 0
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if len(seen) > MAX_GRAPH_NODES:
            return None
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            found += 1
            if id(variable) in wanted:
                return True
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return False if found else None
