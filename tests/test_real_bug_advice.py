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


CASE = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        {body}


def build_model():
    torch.manual_seed(0)
    return Net()


def sample_batch():
    torch.manual_seed(0)
    return torch.randn(4, 8)
"""
"""``h``: a [4, 8] FP16 result with negative values; every case's loss reaches ``fc``."""

CASES = {
    "std-of-one-value": (
        "return h[:, :1].std(-1).sum()",
        "Tensor.std",
        "likely an unbiased std of 1 value (N - 1 = 0 divides by 0): its input [4, 1] holds 1 "
        "value per result",
        "Use the biased estimate: x.std(dim, correction=0) (unbiased=False), or take it only "
        "where the dimension holds more than one value (N > 1)",
    ),
    "var-of-one-value": (
        "return torch.var(h[:1, :1]).sum()",
        "torch.var",
        "likely an unbiased var of 1 value (N - 1 = 0 divides by 0): its input [1, 1] holds 1 "
        "value per result",
        "Use the biased estimate: x.var(dim, correction=0) (unbiased=False), or take it only "
        "where the dimension holds more than one value (N > 1)",
    ),
    "mean-of-an-empty-selection": (
        "return h[x > 100].mean()",
        "Tensor.mean",
        "likely a mean over no values (0 / 0), as x[mask].mean() where the mask selects nothing",
        "Guard the count: x[mask].sum() / mask.sum().clamp_min(1), or skip the term when "
        "mask.sum() == 0",
    ),
    "division-by-an-integer-count": (
        "mask = x > 100\n        return (h * mask).sum() / mask.sum()",
        "Tensor.__truediv__",
        "likely a division by a count that is 0 (as mask.sum() when the mask selects nothing)",
        "Guard the count: x / n.clamp_min(1), or torch.where(n > 0, x / n, 0) where an empty "
        "selection must give 0",
    ),
    "division-by-the-sum-of-a-float-mask": (
        "mask = (x > 100).float()\n        return (h * mask).sum() / mask.sum()",
        "Tensor.__truediv__",
        "likely a division by a count that is 0 (as mask.sum() when the mask selects nothing)",
        "Guard the count: x / n.clamp_min(1), or torch.where(n > 0, x / n, 0) where an empty "
        "selection must give 0",
    ),
    "log-of-zero": (
        "return torch.log(torch.relu(h)).sum()",
        "torch.log",
        "likely the log of 0 (-inf): its input holds 17 zeros and no negative number",
        "Keep the input off 0: torch.log(x.clamp_min(eps)), or torch.log1p(x) for log(1 + x)",
    ),
    "pow-overflowing-fp32": (
        "return (h.float() * 1e20).pow(2).sum()",
        "Tensor.pow",
        "likely a power that overflows FP32 too, beyond its maximum 3.40e+38: its base reaches "
        "|x| = 1.11e+20",
        "Bring the base into range before the power (normalise it, or clip it: "
        "x.clamp(-c, c) ** p), or work in log space: p * torch.log(x.abs())",
    ),
    "negative-base-to-a-fractional-power": (
        "return h.pow(0.5).sum()",
        "Tensor.pow",
        "likely a negative base to a fractional power: the base goes down to -1.107",
        "Clamp the base before a fractional power: x.clamp_min(0) ** p",
    ),
    "zero-to-a-negative-power": (
        "return (torch.relu(h) * 0).pow(-1.0).sum()",
        "Tensor.pow",
        "likely 0 to a negative power: the base holds 32 zeros",
        "Keep the base away from 0: x.clamp_min(eps) ** p",
    ),
    "exp-overflowing-fp32": (
        "return torch.exp(h.float() * 1000).sum()",
        "torch.exp",
        "likely an overflow of FP32 itself: torch.exp goes beyond its maximum 3.40e+38",
        "Keep the exponent below 88.7 (exp overflows FP32 beyond it): subtract the maximum "
        "first (torch.softmax, torch.logsumexp), or torch.exp(x.clamp_max(80))",
    ),
}
"""Each case: the forward's last lines, the op, the cause and the guard NH301 must give."""


@pytest.mark.parametrize("case", CASES)
def test_the_cause_and_its_guard_fit_the_evidence(case: str, tmp_path: Path) -> None:
    body, op, cause, guard = CASES[case]
    path = tmp_path / "model.py"
    path.write_text(CASE.format(body=body))
    findings = scan_file(str(path), verify=False).findings
    errors = [f for f in findings if f.is_error and f.phase is Phase.FORWARD]
    assert [(f.code, f.op) for f in errors] == [("NH301", op)]
    message = errors[0].message
    assert message.split("not a precision problem, ", 1)[1] == cause, message
    assert errors[0].fix is not None
    assert errors[0].fix.title == f"{guard}; no autocast fix"
