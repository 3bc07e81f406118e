"""Review rev19: the default loss (no ``loss_fn``) runs on the model's output with the tracer
paused, outside the attribution the forward and ``loss_fn`` get. Before, an error raised
there by the output's own class (a tensor subclass) was "internal error: ...", and a sparse
output (``mean`` has no sparse kernel) ended the scan with "internal error: NotImplementedError:
Could not run 'aten::mean.dim' ...", even beside a dense output the loss could use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from nan_hunter.api import scan
from nan_hunter.errors import UserCodeError


class _Strict(torch.Tensor):
    """A tensor subclass that refuses a change of dtype (``float()``)."""

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        if getattr(func, "__name__", "") == "float":
            raise TypeError("a _Strict tensor keeps its dtype")
        return super().__torch_function__(func, types, args, kwargs or {})


class _Returns(nn.Module):
    def __init__(self, shape: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.shape = shape

    def forward(self, x: torch.Tensor) -> Any:
        return self.shape(self.fc(x))


def test_the_outputs_own_error_in_the_default_loss_is_the_models() -> None:
    torch.manual_seed(0)
    model = _Returns(lambda h: h.as_subclass(_Strict))
    with pytest.raises(
        UserCodeError,
        match=r"the model raised TypeError during the default loss: a _Strict tensor keeps",
    ) as raised:
        scan(model, torch.randn(4, 8))
    assert (raised.value.user_frame or "").startswith(f"{__file__}:")


def test_a_sparse_output_beside_a_dense_one_scans() -> None:
    torch.manual_seed(0)
    both = _Returns(lambda h: (h.to_sparse(), h * 2))
    torch.manual_seed(0)
    dense = _Returns(lambda h: h * 2)
    dense.load_state_dict(both.state_dict())
    x = torch.randn(4, 8)
    report = scan(both, x)
    assert report.status == "clean"
    assert report.loss_scale == scan(dense, x).loss_scale


def test_an_only_sparse_output_asks_for_a_loss_fn() -> None:
    torch.manual_seed(0)
    with pytest.raises(
        UserCodeError,
        match=r"holds no floating-point tensor to build a loss from \(a sparse one has no mean\); "
        r"define loss_fn",
    ):
        scan(_Returns(lambda h: h.to_sparse()), torch.randn(4, 8))
