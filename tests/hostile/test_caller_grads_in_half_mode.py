"""Half mode on a model the caller has trained a step (its ``.grad`` fields set), which also
nudges a parameter in place under ``torch.no_grad()`` (EMA style): ``model.half()`` converts
each ``.grad`` in place, so the restore must put their FP32 data back; the scan reports what
autocast mode reports, and the caller's model comes back bit-identical, after an error too."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter.engine.model_state import ModelState
from nan_hunter.errors import UserCodeError


class Ema(nn.Module):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
        self.w = nn.Parameter(torch.ones(8))
        self.register_buffer("seen", torch.zeros(()))
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.w.mul_(0.999).add_(0.001)
            self.seen += 1
        if self.fail:
            raise ValueError("boom")
        return (self.layers(x * self.w) * 1e4).exp().sum()


def _trained(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    model.layers[1].eval()
    model.w.requires_grad_(False)
    return model


def _snapshot(model: nn.Module) -> dict[str, object]:
    return {
        "objects": [id(t) for t in [*model.parameters(), *model.buffers()]],
        "grads": [None if p.grad is None else id(p.grad) for p in model.parameters()],
        "values": [t.detach().clone() for t in [*model.parameters(), *model.buffers()]],
        "grad_values": [p.grad.clone() for p in model.parameters() if p.grad is not None],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "training": [m.training for m in model.modules()],
    }


def _assert_identical(model: nn.Module, before: dict[str, object]) -> None:
    after = _snapshot(model)
    assert after["objects"] == before["objects"]
    assert after["grads"] == before["grads"]
    assert after["requires_grad"] == before["requires_grad"]
    assert after["training"] == before["training"]
    for old, new in zip(before["values"], after["values"], strict=True):  # type: ignore[call-overload]
        assert new.dtype == old.dtype == torch.float32
        assert torch.equal(new, old)
    for old, new in zip(before["grad_values"], after["grad_values"], strict=True):  # type: ignore[call-overload]
        assert new.dtype == old.dtype == torch.float32
        assert torch.equal(new, old)


def test_half_mode_with_grads_set_finds_what_autocast_finds() -> None:
    model = _trained(Ema())
    before = _snapshot(model)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    found = {}
    for mode in ("autocast", "half"):
        report = nan_hunter.scan(model, x, mode=mode)
        found[mode] = [(f.code, f.location.line) for f in report.findings]
        _assert_identical(model, before)
    assert found["half"] == found["autocast"] == [("NH301", 31)]


def test_half_mode_error_leaves_the_model_bit_identical() -> None:
    model = _trained(Ema(fail=True))
    before = _snapshot(model)
    with pytest.raises(UserCodeError, match="the model raised ValueError during forward"):
        nan_hunter.scan(model, torch.randn(4, 8), mode="half")
    _assert_identical(model, before)


class _Stubborn(nn.Linear):
    def train(self, mode: bool = True) -> _Stubborn:
        raise RuntimeError("no")


def test_restore_puts_back_every_part_when_one_fails() -> None:
    model = nn.Sequential(nn.Linear(2, 2), _Stubborn(2, 2))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    grads = [p.grad for p in model.parameters()]
    state = ModelState(model)
    model.half()
    model[1].training = False
    with pytest.raises(UserCodeError, match=r"RuntimeError during its restore \(train\(True\)\)"):
        state.restore()
    assert [p.dtype for p in model.parameters()] == [torch.float32] * 4
    assert [id(p.grad) for p in model.parameters()] == [id(g) for g in grads]
    assert [p.grad.dtype for p in model.parameters()] == [torch.float32] * 4  # type: ignore[union-attr]
