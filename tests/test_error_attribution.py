"""An exception during a scan is the model's when its code (or an op it called, passed on by
nan-hunter's tracer, emulation or autocast kernels) raised it, and nan-hunter's own when
nan-hunter's code did: that one must not read "the model raised ..." (it sent users to debug a
model that was fine: a crash in the gradient log on a sparse gradient did)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter import scan
from nan_hunter.errors import UserCodeError
from nan_hunter.precision import gradients
from nan_hunter.trace import deferred


@pytest.mark.parametrize(
    ("module", "name"),
    [(gradients, "_fill_row"), (deferred, "_magnitude_bits")],
    ids=["gradient-log-in-backward", "statistics-in-forward"],
)
def test_our_own_exception_is_not_blamed_on_the_model(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str
) -> None:
    # A bug in nan-hunter's own code: a helper it calls is no longer callable, so the
    # TypeError is raised in nan-hunter's frame.
    monkeypatch.setattr(module, name, None)
    with pytest.raises(TypeError, match="not callable"):
        scan(nn.Linear(4, 2), torch.ones(3, 4))


class _Raises(nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.where = where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.where == "python":
            raise KeyError("the model's own")
        if self.where == "op":
            return h @ torch.ones(5, 2)  # a shape error raised by the op, through the tracer
        if self.where == "function":
            return _FailingBackward.apply(h)
        return h


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("the model's backward")


@pytest.mark.parametrize(
    ("where", "kind", "phase"),
    [("python", "KeyError", "forward"), ("op", "RuntimeError", "forward"),
     ("function", "ValueError", "backward")],
)  # fmt: skip
def test_the_models_exception_is_still_the_models(where: str, kind: str, phase: str) -> None:
    with pytest.raises(UserCodeError, match=f"the model raised {kind} during {phase}"):
        scan(_Raises(where), torch.ones(3, 4))
