"""The Python API under the caller's gradient mode: inside ``torch.no_grad()`` or
``torch.inference_mode()`` the scan still analyses the backward (its passes turn gradients on),
and the caller's mode is the same afterwards."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import torch
from torch import nn

import nan_hunter

MODES: dict[str, Callable[[], AbstractContextManager[object]]] = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "set_grad_enabled(False)": lambda: torch.set_grad_enabled(False),
}


@pytest.mark.parametrize("mode", MODES)
def test_the_backward_is_analysed_whatever_the_callers_grad_mode(mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with MODES[mode]():
        batch = torch.randn(2, 4)
        report = nan_hunter.scan(model, batch, verify_fixes=False)
        assert not torch.is_grad_enabled()
    assert report.target.unchecked == ()
    assert report.target.loss_scaling is not None  # the backward ran
    assert report.backward_nodes > 0
    assert report.status == "clean"
