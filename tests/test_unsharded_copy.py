"""The plain copy of an FSDP2 model that ``nan-hunter run`` re-runs on one rank: the model's
own classes, no torch.distributed hooks or state, the gathered full parameters; references
between modules and tied parameters kept. A one-rank gloo group (a file store) in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from nan_hunter.training.model_copy import (
    full_state,
    gather_full_state,
    sharded,
    unsharded_copy,
)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, 8, bias=False)
        self.head.weight = self.embed.weight
        self.mid = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.register_buffer("gain", torch.full((8,), 0.5))
        self.calls = 0
        self.refs = [self.mid]  # a reference to a submodule, not registered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.head(self.mid(self.embed(x))) * self.gain


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_copy_of_a_fully_sharded_model_is_plain_and_computes_the_same(one_rank: None) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Tied()
    fully_shard(model.mid)
    fully_shard(model)
    x = torch.randn(4, 8)
    expected = model(x)
    state = gather_full_state(model, None)
    assert isinstance(state, dict) and state.keys() == full_state(model).keys()

    copy = unsharded_copy(model, state)
    assert (type(copy), type(copy.mid)) == (Tied, nn.Sequential)
    assert not sharded(copy)
    assert all(type(p) is nn.Parameter for p in copy.parameters())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in copy.modules())
    assert copy.head.weight is copy.embed.weight and copy.refs[0] is copy.mid
    assert copy.calls == 1 and copy.gain is not model.gain
    torch.testing.assert_close(copy(x), expected)
    copy(x).sum().backward()
    assert all(p.grad is not None for p in copy.parameters())
    assert sharded(model) and type(model).__name__ == "FSDPTied"  # the model is untouched


def test_a_model_that_is_not_sharded_gathers_nothing() -> None:
    assert gather_full_state(nn.Linear(2, 2), None) is None
    assert gather_full_state(None, None) is None
