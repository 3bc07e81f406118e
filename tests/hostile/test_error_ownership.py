"""Whose an exception out of the model's call is: nan-hunter's own code that runs inside the
call (the tracer's bookkeeping around an op, the module tracker's and the tracer's hooks, the
emulation's and the autocast policy's work around the op they pass on, the FP32 replay, the
device alias, the device queries, the statistics, the gradient log) raises ``InternalError``
from its own failure, never "the model raised ..."; the model's errors that pass through each
of those places stay the model's (``UserCodeError``, at the user's line).

Each place is made to fail with a monkeypatched bug of ours; ``test_every_hook_of_a_pass_converts``
fails on a new hook of ours that would let its own failure through as the model's.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

import nan_hunter.engine.model_state as model_state
import nan_hunter.precision.device_alias as device_alias
import nan_hunter.precision.emulation as emulation
import nan_hunter.precision.gradients as gradients
import nan_hunter.precision.override as override
import nan_hunter.precision.replay as replay
import nan_hunter.trace.device_queries as device_queries
import nan_hunter.trace.op_calls as op_calls
import nan_hunter.trace.tracer as tracer
from nan_hunter.api import scan
from nan_hunter.errors import InternalError, UserCodeError, converts
from nan_hunter.precision.formats import FP16
from nan_hunter.trace.modules import ModuleTracker


def _bug(*args: object, **kwargs: object) -> Any:
    raise ValueError("a bug of ours")


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).relu()


class _Doubling(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class _CustomFunction(_Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Doubling.apply(self.fc(x))


class _InPlace(_Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).add_(1)


class _Viewed(_Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).view(-1).sigmoid()


class _BannedOp(_Model):
    """``binary_cross_entropy``: CUDA's autocast refuses it, the tracer replays it in FP32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        target = torch.full((4, 8), 0.5)
        return nn.functional.binary_cross_entropy(self.fc(x).sigmoid(), target)


class _ShapeError(_Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) @ torch.ones(3, 3)


class _AsksForCuda(_Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * (2.0 if torch.cuda.is_available() else 1.0)


# -- our own failures: InternalError, from the original ------------------------------------------
_OURS: list[tuple[str, Callable[[pytest.MonkeyPatch], None], type[nn.Module], dict[str, str]]] = [
    ("tracer-before-the-op", lambda m: m.setattr(tracer, "is_inplace", _bug), _Model, {}),
    ("tracer-after-the-op", lambda m: m.setattr(tracer.OpTracer, "_record", _bug), _Model, {}),
    ("tracer-view-op", lambda m: m.setattr(tracer.OpTracer, "_inherit_producer", _bug),
     _Viewed, {}),
    ("tracer-custom-function", lambda m: m.setattr(tracer, "backward_location", _bug),
     _CustomFunction, {}),
    ("tracer-backward-node-hook", lambda m: m.setattr(tracer.OpTracer, "_on_node", _bug),
     _Model, {}),
    ("tracer-refusal-check", lambda m: m.setattr(op_calls, "policy_failure", _bug),
     _ShapeError, {}),
    ("module-tracker-hook", lambda m: m.setattr(tracer, "output_leaves", _bug), _Model, {}),
    ("model-state-protect", lambda m: m.setattr(model_state.ModelState, "protect", _bug),
     _InPlace, {}),
    ("statistics", lambda m: m.setattr(tracer.deferred, "_magnitude_bits", _bug), _Model, {}),
    ("emulation-choice", lambda m: m.setattr(emulation, "_all_low", _bug), _Model, {}),
    ("emulation-rounding", lambda m: m.setattr(emulation, "_down", _bug), _Model, {}),
    ("emulation-gradient-log-of-a-cast",
     lambda m: m.setattr(emulation, "_same_shape_tensors", _bug), _Model, {}),
    ("gradient-log", lambda m: m.setattr(gradients, "fill_row", _bug), _Model, {}),
    ("fp32-replay-casts", lambda m: m.setattr(replay, "tree_map", _bug), _BannedOp, {}),
    ("autocast-policy-casts", lambda m: m.setattr(override, "_cast_to", _bug), _Model,
     {"numerics": "real"}),
    ("device-alias", lambda m: m.setattr(device_alias, "_maps", _bug), _Model, {}),
    ("device-queries", lambda m: m.setattr(device_queries, "is_installed", _bug),
     _AsksForCuda, {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("patch", "model", "options"), [c[1:] for c in _OURS], ids=[c[0] for c in _OURS]
)
def test_our_own_failure_inside_the_models_call_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
    patch: Callable[[pytest.MonkeyPatch], None],
    model: type[nn.Module],
    options: dict[str, str],
) -> None:
    torch.manual_seed(0)
    built, x = model(), torch.randn(4, 8)
    patch(monkeypatch)
    with pytest.raises(InternalError, match="ValueError: a bug of ours") as raised:
        scan(built, x, **options)  # type: ignore[arg-type]
    assert isinstance(raised.value.__cause__, ValueError)
    assert raised.value.original is raised.value.__cause__


def test_a_bug_on_a_line_of_the_emulation_itself_is_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    # sys._getframe(...).f_code in the emulation's own code, in the backward
    monkeypatch.setattr(emulation, "sys", SimpleNamespace(_getframe=math.sqrt))
    torch.manual_seed(0)
    with pytest.raises(InternalError, match="'float' object has no attribute 'f_code'") as raised:
        scan(nn.Linear(8, 2), torch.randn(4, 8))
    assert isinstance(raised.value.__cause__, AttributeError)


def test_our_bookkeeping_through_the_device_alias_is_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracer's record of an op asks ``torch.is_autocast_enabled`` for each device, a call
    the device alias passes on: the failure of that call is the tracer's, so ours."""
    monkeypatch.setattr(tracer, "_AUTOCAST_DEVICES", ("bogus", "cpu"))
    with pytest.raises(InternalError, match="device string: bogus") as raised:
        scan(_Model(), torch.randn(4, 8))
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_our_module_hook_through_the_tracer_is_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module tracker's hook walks each module's output with the tracer on: a torch call
    there, which the tracer passes on, fails in our hook."""
    monkeypatch.setattr(tracer, "output_leaves", functools.partial(torch.reshape, shape=(-1, 7)))
    with pytest.raises(InternalError, match=r"shape '\[-1, 7\]' is invalid") as raised:
        scan(_Model(), torch.randn(4, 8))
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_our_bug_inside_a_standard_library_call_is_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    # the gradient log calls copy.deepcopy(dest, data, rounded): AttributeError inside copy.py
    monkeypatch.setattr(gradients, "fill_row", copy.deepcopy)
    torch.manual_seed(0)
    with pytest.raises(InternalError) as raised:
        scan(_Model(), torch.randn(4, 8))
    assert isinstance(raised.value.__cause__, AttributeError)


def test_the_device_alias_converts_its_own_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_alias, "_maps", _bug)
    with device_alias.DeviceAlias(), pytest.raises(InternalError, match="a bug of ours"):
        torch.is_autocast_enabled("cuda")


def test_every_hook_of_a_pass_converts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hook a pass registers on torch (module hooks, global or per module, tensor hooks,
    autograd node hooks) is wrapped by ``errors.ours``: a new hook of ours that is not would
    let its own failure out as the model's."""
    registered: list[tuple[str, Any]] = []

    def recording(kind: str, original: Callable[..., Any], at: int) -> Callable[..., Any]:
        def register(*args: Any, **kwargs: Any) -> Any:
            registered.append((kind, args[at]))
            return original(*args, **kwargs)

        return register

    module_mod = torch.nn.modules.module
    for name in ("register_module_forward_pre_hook", "register_module_forward_hook",
                 "register_module_full_backward_hook"):  # fmt: skip
        monkeypatch.setattr(module_mod, name, recording(name, getattr(module_mod, name), 0))
    for name in ("register_forward_pre_hook", "register_forward_hook",
                 "register_full_backward_hook"):  # fmt: skip
        monkeypatch.setattr(nn.Module, name, recording(name, getattr(nn.Module, name), 1))
    monkeypatch.setattr(
        torch.Tensor, "register_hook", recording("tensor", torch.Tensor.register_hook, 1)
    )
    torch.manual_seed(0)
    scan(_CustomFunction(), torch.randn(4, 8))
    ours = [(kind, hook) for kind, hook in registered if _module_of(hook).startswith("nan_hunter")]
    assert {kind for kind, _ in ours} >= {"register_module_forward_pre_hook",
                                          "register_forward_hook"}  # fmt: skip
    for kind, hook in ours:
        assert converts(hook), f"{kind}: {hook!r} lets its own failure out as the model's"
    op_tracer = tracer.OpTracer(ModuleTracker(nn.Linear(1, 1)), FP16)
    assert converts(op_tracer.backward_hooks()._hook_for(0))  # autograd node hooks
    assert converts(device_queries._tell)  # the listener of torch.cuda's queries


def _module_of(hook: Any) -> str:
    return getattr(getattr(hook, "__func__", hook), "__module__", "") or ""


# -- the model's errors through each of those places: the model's ---------------------------------
class _BackwardShapeError(_Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _BadBackward.apply(self.fc(x))


class _BadBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad @ torch.ones(3, 3, dtype=grad.dtype)  # the emulation passes it on


class _InPlaceAfterSave(_Model):
    """Autograd's own error, from the engine: no frame between it and the backward's call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x).sigmoid()
        y.mul_(2)
        return y


class _ReplayError(_Model):
    """An op CUDA's autocast refuses in FP16 (replayed in FP32) whose replay fails too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        target = torch.full((4, 8), 2.0)
        return nn.functional.binary_cross_entropy(self.fc(x).sigmoid(), target)


class _AliasedCustomFwd(_Model):
    """``custom_fwd(device_type="cuda")``: the input cast runs in the alias's ``_cast``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _CastInputs.apply(self.fc(x))


class _CastInputs(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view(3, -1, 5)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _QueryError(_Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda.is_available("twice")  # type: ignore[call-arg]
        return self.fc(x)


class _ForwardHookError(_Model):
    """The model's own forward hook, run beside the module tracker's."""

    def __init__(self) -> None:
        super().__init__()
        self.fc.register_forward_hook(self._check)

    @staticmethod
    def _check(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        raise KeyError("the model's hook")


class _TensorHookError(_Model):
    """The model's own tensor hook, in the backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h.register_hook(self._check)
        return h

    @staticmethod
    def _check(grad: torch.Tensor) -> None:
        raise LookupError("the model's gradient hook")


_MODELS: list[tuple[str, type[nn.Module], str, str, dict[str, str]]] = [
    ("op-through-the-tracer", _ShapeError, "forward", "mat1 and mat2 shapes", {}),
    ("emulation-in-backward", _BackwardShapeError, "backward",
     "mat1 and mat2 shapes cannot be multiplied", {}),
    ("autograd-engine", _InPlaceAfterSave, "backward", "modified by an inplace operation", {}),
    ("fp32-replay", _ReplayError, "forward", "target should be between 0 and 1", {}),
    ("alias-custom-fwd", _AliasedCustomFwd, "forward", "is invalid for input of size 32", {}),
    ("policy-kernel", _ShapeError, "forward", "mat1 and mat2 shapes", {"numerics": "real"}),
    ("device-query", _QueryError, "forward", "takes 0 positional arguments", {}),
    ("model-forward-hook", _ForwardHookError, "forward", "the model's hook", {}),
    ("model-tensor-hook", _TensorHookError, "backward", "the model's gradient hook", {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("model", "phase", "message", "options"), [c[1:] for c in _MODELS], ids=[c[0] for c in _MODELS]
)
def test_the_models_error_through_each_of_our_layers_stays_the_models(
    model: type[nn.Module], phase: str, message: str, options: dict[str, str]
) -> None:
    torch.manual_seed(0)
    with pytest.raises(UserCodeError, match=f"the model raised .* during {phase}.*{message}"):
        scan(model(), torch.randn(4, 8), **options)  # type: ignore[arg-type]


class _AliasedAutocastError(_Model):
    """A bad device type given to ``torch.autocast`` (nan-hunter aliases "cuda" on a CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cdua"):
            return self.fc(x)


def test_the_models_error_through_the_device_alias_is_the_models() -> None:
    torch.manual_seed(0)
    with pytest.raises(UserCodeError, match="the model raised RuntimeError during forward"):
        scan(_AliasedAutocastError(), torch.randn(4, 8), numerics="real")


def test_the_models_error_inside_a_standard_library_call_is_the_models() -> None:
    class Decodes(_Model):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            dataclasses.replace(self.fc)  # type: ignore[type-var]  # TypeError in dataclasses.py
            return self.fc(x)

    torch.manual_seed(0)
    with pytest.raises(UserCodeError, match=r"the model raised TypeError during forward") as raised:
        scan(Decodes(), torch.randn(4, 8))
    # the model's line, not dataclasses.py's
    assert (raised.value.user_frame or "").startswith(f"{__file__}:")


def test_code_python_generates_passes_the_models_error_on() -> None:
    """A frozen dataclass's ``__setattr__`` (``<string>``) raising in the model's forward."""

    @dataclasses.dataclass(frozen=True)
    class Config:
        width: int = 8

    class Reconfigures(_Model):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Config().width = 4  # type: ignore[misc]
            return self.fc(x)

    torch.manual_seed(0)
    with pytest.raises(UserCodeError, match=r"the model raised FrozenInstanceError"):
        scan(Reconfigures(), torch.randn(4, 8))


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    attentions: torch.Tensor = dataclasses.field(init=False)  # set only when asked for


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> _Out:
        return _Out(self.fc(x))


class _ReturnsADataclass(nn.Module):
    def __init__(self, whole: bool) -> None:
        super().__init__()
        self.head = _Head()
        self.whole = whole

    def forward(self, x: torch.Tensor) -> object:
        out = self.head(x)
        return out if self.whole else out.logits


@pytest.mark.parametrize("whole", [False, True])
def test_a_dataclass_output_with_a_field_never_set_scans(whole: bool) -> None:
    """The module tracker's hook walks the output (and, ``whole``, the default loss too)."""
    torch.manual_seed(0)
    model, x = _ReturnsADataclass(whole), torch.randn(4, 8)
    report = scan(model, x)
    assert report.status == "clean"
    assert report.loss_scale == scan(model.head.fc, x).loss_scale


def test_an_internal_error_reads_as_the_original_on_the_command_line() -> None:
    """The command line's line and ``--debug`` traceback name the original exception."""
    import traceback

    from nan_hunter.cli.output import internal_error
    from nan_hunter.process.worker import _summary

    with pytest.raises(InternalError) as raised:
        try:
            {}["key"]
        except KeyError as exc:
            raise InternalError(exc) from exc
    wrapped = raised.value
    assert internal_error(wrapped) == (
        "internal error: KeyError: 'key' (use --debug for a traceback)"
    )
    assert _summary(wrapped) == "KeyError: 'key'"
    shown = "".join(traceback.format_exception(wrapped))
    assert "KeyError: 'key'" in shown and "InternalError" in shown
