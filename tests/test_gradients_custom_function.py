"""A parameter behind a custom ``autograd.Function`` keeps the selective histograms.

``_PASS_THROUGH`` lists ``PyNode`` for custom functions, but the node of a Python
``autograd.Function`` is an instance of ``<Name>Backward`` (a ``BackwardCFunction`` subclass), so
the name never matches: every parameter reached through one (a straight-through fake quantizer,
a custom cast) makes the whole pass run twice, the second time reading every statistic back as
it is seen. Counting a node as pass-through can only add histograms, never drop one.
"""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter.precision.formats import FP16
from nan_hunter.precision.gradients import GradientLog
from tests.test_gradients import _low_pass


class _StraightThrough(torch.autograd.Function):
    """Fake quantization with a straight-through gradient, as quantization-aware training
    uses it: the gradient is handed on unchanged."""

    @staticmethod
    def forward(ctx: object, w: torch.Tensor) -> torch.Tensor:
        return torch.round(w * 8) / 8

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _Quantized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(16, 16, bias=False)
        self.outer = nn.Linear(16, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(nn.functional.linear(x, _StraightThrough.apply(self.inner.weight)))
        return nn.functional.linear(h, _StraightThrough.apply(self.outer.weight))


def test_a_custom_function_hands_the_gradient_on_without_a_second_pass() -> None:
    torch.manual_seed(0)
    model = _Quantized()
    careful, _ = _low_pass(model, GradientLog(FP16, depth=1))
    records, forwards = _low_pass(model, GradientLog(FP16))
    assert records == careful and set(records) == {"inner.weight", "outer.weight"}
    assert forwards == 1
