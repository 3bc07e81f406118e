"""Error attribution: a function of ours that passes a call on
(``blame._PASSES_ON``, at a line marked ``PASSES_ON_MARK``) makes an exception the model's only
when the call it passed on was made for the model. Before, the innermost such frame decided
alone, so our own code calling a torch function that the tracer, the emulation or the device
alias passes on (the tracer's bookkeeping, a module hook of ours) raised "the model raised ...":
now the next frame outwards decides, up to the frame that called the model.

Guards: the model's errors that pass through each of those functions, in forward and in
backward, stay the model's."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import nan_hunter.trace.tracer as tracer
from nan_hunter.api import scan
from nan_hunter.blame import _CALLS_THE_MODEL, _PASSES_ON
from nan_hunter.errors import UserCodeError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU())


def test_our_bookkeeping_through_the_device_alias_is_not_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tracer's record of an op asks ``torch.is_autocast_enabled`` for each device: with the
    device alias on, that call runs in the alias's lambda, at its marked line."""
    monkeypatch.setattr(tracer, "_AUTOCAST_DEVICES", ("bogus", "cpu"))  # a bug of ours
    with pytest.raises(RuntimeError, match="device string: bogus") as raised:
        scan(_model(), torch.randn(4, 8))
    assert not isinstance(raised.value, UserCodeError)  # before: "the model raised ..."


def test_our_module_hook_through_the_tracer_is_not_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The module tracker's hook walks each module's output with the tracer on: a torch call
    there runs in the tracer's ``__torch_function__``, at its marked line."""
    monkeypatch.setattr(tracer, "output_leaves", functools.partial(torch.reshape, shape=(-1, 7)))
    with pytest.raises(RuntimeError, match=r"shape '\[-1, 7\]' is invalid") as raised:
        scan(_model(), torch.randn(4, 8))
    assert not isinstance(raised.value, UserCodeError)  # before: "the model raised ..."


class _Doubling(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad @ torch.ones(3, 3, dtype=grad.dtype)  # the emulation passes it on


class _BackwardShapeError(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Doubling.apply(self.fc(x))


class _InPlaceAfterSave(nn.Module):
    """Autograd's own error, from the engine: no frame between it and the backward's call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x).sigmoid()
        y.mul_(2)
        return y


class _ReplayError(nn.Module):
    """An op CUDA's autocast refuses in FP16 (replayed in FP32) whose replay fails too."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        target = torch.full((4, 8), 2.0)
        return nn.functional.binary_cross_entropy(self.fc(x).sigmoid(), target)


class _AliasedCustomFwd(nn.Module):
    """``custom_fwd(device_type="cuda")``: the input cast runs in the alias's ``_cast``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

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


@pytest.mark.parametrize(
    ("model", "phase", "message"),
    [
        (_BackwardShapeError, "backward", "mat1 and mat2 shapes cannot be multiplied"),
        (_InPlaceAfterSave, "backward", "modified by an inplace operation"),
        (_ReplayError, "forward", "target should be between 0 and 1"),
        (_AliasedCustomFwd, "forward", "is invalid for input of size 32"),
    ],
    ids=["emulation-in-backward", "autograd-engine", "fp32-replay", "alias-custom-fwd"],
)
def test_the_models_error_through_each_pass_on_stays_the_models(
    model: type[nn.Module], phase: str, message: str
) -> None:
    torch.manual_seed(0)
    with pytest.raises(UserCodeError, match=f"the model raised .* during {phase}.*{message}"):
        scan(model(), torch.randn(4, 8))


def test_the_frames_that_call_the_model_pass_calls_on() -> None:
    assert _CALLS_THE_MODEL <= _PASSES_ON
