"""Nested tensors (``torch.nested``): no statistic a scan takes (``aminmax``, the counts) has a
kernel for one, so a model that computes with them ended before in "internal error:
NotImplementedError: Could not run 'aten::aminmax.out' with arguments from the
'NestedTensorCPU' backend". A scan now refuses them in one line naming the model's line, and a
nested batch at load time, as it refuses sparse ones. Meta tensors that torch's own Python builds
in such a forward (for shapes) have no values to measure, and a loss on the meta device is the
model's error."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from nan_hunter.api import scan
from nan_hunter.errors import LoadError, UnsupportedError, UserCodeError


class _NestedOut(nn.Module):
    def __init__(self, layout: torch.layout) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.layout = layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return torch.nested.nested_tensor([h[0:2], h[2:3]], layout=self.layout)  # the line


_LINE = next(
    i
    for i, text in enumerate(Path(__file__).read_text(encoding="utf-8").splitlines(), 1)
    if text.endswith("# the line")
)


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_a_nested_tensor_in_the_forward_is_refused_at_the_models_line(
    layout: torch.layout,
) -> None:
    torch.manual_seed(0)
    with warnings.catch_warnings(), pytest.raises(UnsupportedError) as raised:
        warnings.simplefilter("ignore")  # "the PyTorch API of nested tensors is in prototype"
        scan(_NestedOut(layout), torch.randn(3, 4))
    message = str(raised.value)
    assert f" at {__file__}:{_LINE} returned a nested tensor (torch.nested): " in message
    assert message.endswith("scan the model on padded ones (nested.to_padded_tensor(0.0))")


def test_a_nested_batch_is_refused_at_load() -> None:
    batch = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])
    with pytest.raises(LoadError, match=r"returned a nested tensor: nan-hunter scans dense"):
        scan(nn.Linear(4, 4), batch)


def test_a_loss_on_the_meta_device_is_the_models_error() -> None:
    """Before: "internal error: RuntimeError: Tensor.item() cannot be called on meta
    tensors" (the loss's statistics)."""

    class MetaOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x).to("meta")

    with pytest.raises(UserCodeError, match=r"^the loss is on the meta device, without values"):
        scan(MetaOut(), torch.randn(2, 4))
