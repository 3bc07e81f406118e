"""The Python API under models that write to their own state in forward: the scan accepts them
and leaves every parameter and buffer bit-identical (same tensor objects, dtypes and values)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import nan_hunter


class Writer(nn.Module):
    def __init__(self, write: Callable[[Writer, torch.Tensor], None]) -> None:
        super().__init__()
        self.write = write
        self.fc = nn.Linear(4, 4)
        self.register_buffer("running", torch.zeros(4))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.write(self, x)
        return self.fc(x)


def _ema(m: Writer, x: torch.Tensor) -> None:
    m.running.mul_(0.9).add_(x.mean(0).detach())


def _count(m: Writer, x: torch.Tensor) -> None:
    m.count += 1


def _rebind(m: Writer, x: torch.Tensor) -> None:
    m.running = 0.9 * m.running + x.mean(0).detach()


def _lerp(m: Writer, x: torch.Tensor) -> None:
    with torch.no_grad():
        m.running.lerp_(x.mean(0), 0.1)


def _param_in_place(m: Writer, x: torch.Tensor) -> None:
    with torch.no_grad():
        m.fc.weight.mul_(1.0)


WRITES = [_ema, _count, _rebind, _lerp, _param_in_place]


@pytest.mark.parametrize("mode", ["autocast", "half"])
@pytest.mark.parametrize("write", WRITES, ids=[w.__name__.strip("_") for w in WRITES])
def test_scan_accepts_state_writes_and_restores_them(
    write: Callable[[Writer, torch.Tensor], None], mode: str
) -> None:
    torch.manual_seed(0)
    model = Writer(write)
    tensors = {n: t for n, t in [*model.named_parameters(), *model.named_buffers()]}
    values = {n: t.detach().clone() for n, t in tensors.items()}
    nan_hunter.scan(model, torch.randn(2, 4), mode=mode, backward=False)
    after = dict([*model.named_parameters(), *model.named_buffers()])
    for name, tensor in tensors.items():
        assert after[name] is tensor, name
        assert after[name].dtype == values[name].dtype, name
        assert torch.equal(after[name], values[name]), name
