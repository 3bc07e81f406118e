"""Findings that read ``zeros`` on tensors large enough to be sampled (more than ``2 * SAMPLE``
values: since d0986e2, zeros are estimated on a strided sample there).

Review r16: both tests pass at 836bc0a and fail at d0986e2. A value that flushes (or a divisor's
0) off the sample is invisible, and a whole column of a row-major tensor whose row length is a
multiple of the stride is never sampled.
"""

from __future__ import annotations

import torch
from torch import nn

import nan_hunter
from nan_hunter.trace.stats import SAMPLE

_N = 512  # 512 x 512 = 4 * SAMPLE values: the sample takes every 4th, columns 0, 4, 8, ...


class _FlushedColumn(nn.Module):
    """Column 1 of the logits sits at -20: its sigmoid (2e-9) flushes to 0 in FP16, and the
    log of it is -inf (in FP32: -20). Every other logit is ~1."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(_N, _N)
        with torch.no_grad():
            self.fc.weight.mul_(0.01)
            self.fc.bias.fill_(1.0)
            self.fc.bias[1] = -20.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(self.fc(x))
        return torch.log(p)


def test_a_flush_off_the_sample_is_still_the_upstream_cause() -> None:
    assert _N * _N >= 2 * SAMPLE
    torch.manual_seed(0)
    model = _FlushedColumn()
    report = nan_hunter.scan(model, torch.randn(_N, _N) * 0.1, backward=False)
    (finding,) = report.findings
    assert finding.code == "NH202"
    assert finding.upstream is not None
    assert finding.upstream.op == "torch.sigmoid"


class _DivideByBuffer(nn.Module):
    def __init__(self, zero_at: int) -> None:
        super().__init__()
        self.fc = nn.Linear(_N, _N)
        divisor = torch.ones(_N, _N)
        divisor.view(-1)[zero_at] = 0.0
        self.register_buffer("divisor", divisor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) / self.divisor


def test_the_divisor_s_zeros_are_counted_not_estimated() -> None:
    """NH301 names how many zeros the divisor holds: one, wherever it is."""
    for zero_at in (1, 4):  # off the sample, on it
        torch.manual_seed(0)
        report = nan_hunter.scan(_DivideByBuffer(zero_at), torch.randn(_N, _N), backward=False)
        (finding,) = report.findings
        assert finding.code == "NH301"
        assert finding.message.endswith("the divisor holds 1 zeros"), (zero_at, finding.message)
