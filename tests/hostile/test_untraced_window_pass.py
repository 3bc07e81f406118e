"""Untraced forward of a loss-scale window's pass: where the graph
was not kept, the window's pass runs its forward without the tracer, and so without what the
tracer does besides recording: an op CUDA's autocast stops is run again in FP32 (the scan goes
on and reports it), and an in-place write to a parameter is announced so that the parameter is
restored after the pass. The first three tests fail before (with ``RETAIN_BYTES`` large, the
graph kept, they pass there): the report must be the same either way. The last one guards the
fix: an op of the model failing in the untraced forward is still the model's error."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nan_hunter.api import scan
from nan_hunter.engine import runner
from nan_hunter.errors import UserCodeError
from nan_hunter.findings import Report


class _Decoder(nn.Module):
    """fx_loss_weight_underflow's decoder: its gradient is lost at the FP32 -> FP16 boundary of
    the loss at GradScaler's 2**16, so the scan runs a second backward at the scale the boundary
    needs (a pass without events)."""

    def __init__(self, clip: str = "") -> None:
        super().__init__()
        self.hidden = nn.Linear(32, 128)
        self.out = nn.Linear(128, 256)
        self.clip = clip

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if self.clip == "no_grad":  # weight clipping in forward (WGAN style)
            with torch.no_grad():
                self.hidden.weight.clamp_(-0.1, 0.1)
        elif self.clip == "data":
            self.hidden.weight.data.clamp_(-0.1, 0.1)
        return self.out(torch.relu(self.hidden(z)))


def _batch() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(64, 32)


def _underflowing_loss(decoded: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return 1e-6 * F.mse_loss(decoded, torch.zeros(decoded.shape))


def _banned_op_too(decoded: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The same loss and a BCE term CUDA autocast refuses ("unsafe to autocast")."""
    bce = F.binary_cross_entropy(torch.sigmoid(decoded[:, :1]), (z[:, :1] > 0).float())
    return _underflowing_loss(decoded, z) + 0.0 * bce


def _scan(clip: str, loss_fn: object, retain: int, monkeypatch: pytest.MonkeyPatch) -> Report:
    monkeypatch.setattr(runner, "RETAIN_BYTES", retain)
    torch.manual_seed(0)
    model = _Decoder(clip)
    before = [t.detach().clone() for t in model.state_dict().values()]
    report = scan(model, _batch(), loss_fn)
    after = list(model.state_dict().values())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    return dataclasses.replace(report, seconds=0.0)


def _codes(report: Report) -> list[tuple[str, str | None]]:
    return [(f.code, f.op) for f in report.findings]


def test_a_banned_op_is_replayed_in_the_untraced_forward_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept = _scan("", _banned_op_too, 1 << 40, monkeypatch)
    assert _codes(kept)[:2] == [
        ("NH302", "torch.nn.functional.binary_cross_entropy"),
        ("NH402", "torch.nn.functional.mse_loss"),
    ]
    assert kept.loss_scale is not None
    assert _scan("", _banned_op_too, 0, monkeypatch) == kept  # before: "the model raised"


class _MaskedAttention(nn.Module):
    """The usual causal mask, ``masked_fill(mask, -1e9)`` on an FP16 score: CUDA stops it
    (-1e9 does not fit FP16), the traced pass replays it in FP32 and reports NH104."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(32, 32)
        self.out = nn.Linear(32, 256)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        scores = self.q(z) @ z.t()
        mask = torch.ones_like(scores, dtype=torch.bool).triu(1)
        return self.out(torch.softmax(scores.masked_fill(mask, -1e9), -1) @ z)


def test_a_mask_constant_beyond_fp16_is_replayed_in_the_untraced_forward_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reports = []
    for retain in (1 << 40, 0):  # before, 0: "the model raised RuntimeError ... overflow"
        monkeypatch.setattr(runner, "RETAIN_BYTES", retain)
        torch.manual_seed(0)
        report = scan(_MaskedAttention(), _batch(), _underflowing_loss)
        reports.append(dataclasses.replace(report, seconds=0.0))
    assert [code for code, _ in _codes(reports[0])][:2] == ["NH104", "NH402"]
    assert reports[0].loss_scale is not None
    assert reports[1] == reports[0]


@pytest.mark.parametrize("clip", ["no_grad", "data"])
def test_a_parameter_written_in_the_untraced_forward_is_restored(
    clip: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``clamp_`` under no_grad made the scan fail ("the model wrote to its
    parameters in place, out of nan-hunter's sight"); through ``.data`` (no version change)
    the clipped weights stayed in the user's model."""
    kept = _scan(clip, _underflowing_loss, 1 << 40, monkeypatch)
    assert [code for code, _ in _codes(kept)] == ["NH402", "NH402"]
    assert _scan(clip, _underflowing_loss, 0, monkeypatch) == kept


class _FailsOnItsSecondForward(_Decoder):
    """An op of the model fails (a shape error, raised by the kernel) on its second forward
    only: that of the window's pass, untraced when the graph is not kept."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            z = z[:, :31]
        return super().forward(z)


@pytest.mark.parametrize("retain", [1 << 40, 0])
def test_an_op_failing_in_the_untraced_forward_is_the_models(
    retain: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "RETAIN_BYTES", retain)
    torch.manual_seed(0)
    model = _FailsOnItsSecondForward()
    if retain:  # the window's pass reuses the kept forward: the model runs once
        assert [code for code, _ in _codes(scan(model, _batch(), _underflowing_loss))] == [
            "NH402",
            "NH402",
        ]
        return
    with pytest.raises(
        UserCodeError,
        match=r"the model raised RuntimeError during forward in "
        r"module 'hidden': mat1 and mat2 shapes cannot be multiplied",
    ):
        scan(model, _batch(), _underflowing_loss)
