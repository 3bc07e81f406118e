"""A NaN that FP32 has too (NH301) gets the cause and advice that fit where it arose: the
forward of ``sqrt`` fails on a negative number, its backward on 0 (the norm of an all-zero
vector: the forward is 0, the gradient 1 / (2 sqrt(0)) is inf and 0 * inf is NaN)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nan_hunter.api import scan_file
from nan_hunter.findings import Finding, Phase

MODEL = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = {activation}(self.fc(x))
        n = {norm}
        return (h / (n + 1e-3)).sum()


def build_model():
    torch.manual_seed(0)
    m = Net()
    with torch.no_grad():
        m.fc.bias.fill_(-100.0)
    return m


def sample_batch():
    return torch.ones(4, 8)
"""
"""Every activation is 0 (a bias of -100 before a relu): the norm of each row is sqrt(0)."""

NORMS = {
    "torch-sqrt": "torch.sqrt((h * h).sum(-1, keepdim=True))",
    "method-sqrt": "(h * h).sum(-1, keepdim=True).sqrt()",
    "pow-sum": "torch.sqrt(h.pow(2).sum(-1, keepdim=True))",
}


def _error(tmp_path: Path, norm: str, activation: str = "torch.relu") -> Finding:
    path = tmp_path / "model.py"
    path.write_text(MODEL.format(norm=norm, activation=activation))
    errors = [f for f in scan_file(str(path), verify=False).findings if f.is_error]
    assert len(errors) == 1, [f.message for f in errors]
    return errors[0]


@pytest.mark.parametrize("norm", NORMS)
def test_sqrt_at_zero_in_a_norm_is_named_with_the_eps_advice(norm: str, tmp_path: Path) -> None:
    finding = _error(tmp_path, NORMS[norm])
    assert (finding.code, finding.phase, finding.op.rsplit(".", 1)[-1]) == (
        "NH301", Phase.BACKWARD, "sqrt"
    )
    assert "likely sqrt at 0, whose gradient 1 / (2 sqrt(x)) is inf there" in finding.message
    assert "negative" not in finding.message
    assert finding.fix is not None
    assert finding.fix.title.startswith("Add eps inside the root: torch.sqrt(x + eps)")
    assert "torch.linalg.vector_norm" in finding.fix.title


def test_a_fractional_power_at_zero_gets_its_own_cause(tmp_path: Path) -> None:
    finding = _error(tmp_path, "(h * h).sum(-1, keepdim=True) ** 0.5")
    assert finding.phase is Phase.BACKWARD
    assert "a fractional power at 0, whose gradient is inf there" in finding.message
    assert finding.fix is not None and "x.clamp_min(eps) ** p" in finding.fix.title


def test_the_forward_sqrt_of_a_negative_number_keeps_its_cause(tmp_path: Path) -> None:
    finding = _error(tmp_path, "torch.sqrt(h.sum(-1, keepdim=True))", activation="")
    assert finding.phase is Phase.FORWARD
    assert "likely the square root of a negative number" in finding.message
    assert finding.fix is not None
    assert finding.fix.title.startswith("Clamp the input: torch.sqrt(x.clamp_min(0) + eps)")
