"""Sparse gradients (``nn.Embedding(sparse=True)``, recommendation models): statistics of their
stored values with the rest counted as zeros, over the full shape, never a dense copy."""

from __future__ import annotations

import torch
from torch import nn

from nan_hunter import scan
from nan_hunter.precision.formats import FP16
from nan_hunter.trace import deferred
from nan_hunter.trace.stats import tensor_stats


def test_sparse_statistics_equal_those_of_the_dense_tensor() -> None:
    dense = torch.zeros(50, 4)
    dense[3] = torch.tensor([1.0, -2.0, 1e-6, 0.0])
    dense[7] = torch.tensor([5.0, 0.5, float("inf"), -1.0])
    dense[9] = torch.tensor([2.0, 3.0, 4.0, 5.0])
    for t in (dense, dense[:, :2].contiguous(), torch.ones(3, 2)):
        sparse = t.to_sparse()
        expected = tensor_stats(t, FP16)
        assert tensor_stats(sparse, FP16) == expected
        queue = deferred.StatsQueue(FP16)
        assert queue.stats(queue.add(sparse, True)) == expected
        assert tensor_stats(sparse, FP16, counts=False) == tensor_stats(t, FP16, counts=False)


class _Recommender(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, 16, sparse=True)
        self.fc = nn.Linear(16, 2)
        self.scale = scale

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(idx).sum(1)) * self.scale


def test_a_model_with_a_sparse_embedding_scans() -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (4, 8))
    model = _Recommender(1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert scan(model, ids).status == "clean"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # a backward overflow: the sparse gradient of the embedding carries the inf
    torch.manual_seed(0)
    report = scan(_Recommender(1.0), ids, lambda out, b: out.float().sum() * 1e6)
    assert [(f.code, f.op, f.phase.value) for f in report.findings] == [
        ("NH401", "Tensor.float", "backward")
    ]
    assert report.backward_nodes == 7


def test_half_mode_measures_a_sparse_gradient_as_its_dense_twin() -> None:
    """In half mode the embedding's sparse gradient is FP16 and rounded by the emulation: the
    gradient log measures its stored values (it crashed on ``aminmax`` of a sparse tensor, and
    the crash was blamed on the model). The loss-scale window is the dense twin's."""
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (4, 8))
    sparse = _Recommender(1e-3)
    dense = _Recommender(1e-3)
    dense.emb.sparse = False
    dense.load_state_dict(sparse.state_dict())
    reports = [scan(m, ids, mode="half") for m in (sparse, dense)]
    assert reports[0].status == reports[1].status == "clean"
    assert reports[0].loss_scale == reports[1].loss_scale
    assert reports[0].loss_scale is not None and reports[0].loss_scale.low is not None
