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


class _Running(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("running", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.running.mul_(0.9).add_(x.mean(0).detach())
        x.mul_(2.0)  # the batch written to in place
        return self.fc(x).mul(1e4).exp().sum()


def test_a_model_and_batch_made_in_inference_mode_scan_as_outside() -> None:
    """Parameters, buffers and batch tensors made inside ``torch.inference_mode()`` have no
    version counter, and outside it refuse in-place writes and the backward: the scan runs on
    normal copies, finds what it finds outside, and leaves the originals as they were."""
    torch.manual_seed(0)
    outside = _Running()
    found = {}
    with torch.inference_mode():
        inside = _Running()
        inside.load_state_dict(outside.state_dict())
        batch = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
        tensors = [*inside.parameters(), *inside.buffers(), batch]
        values = [t.clone() for t in tensors]
        report = nan_hunter.scan(inside, batch)
        found["inside"] = [(f.code, f.location.line) for f in report.findings]
    assert list(map(id, [*inside.parameters(), *inside.buffers(), batch])) == list(map(id, tensors))
    assert all(t.is_inference() for t in tensors)
    assert all(torch.equal(t, v) for t, v in zip(tensors, values, strict=True))
    report = nan_hunter.scan(outside, values[-1].clone())
    found["outside"] = [(f.code, f.location.line) for f in report.findings]
    assert found["inside"] == found["outside"] == [("NH301", 46)]
