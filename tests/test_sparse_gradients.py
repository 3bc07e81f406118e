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


def test_half_mode_scans_a_sparse_embedding() -> None:
    """In half mode the embedding's sparse gradient is FP16: the gradient log measures the
    values it stores (it crashed on ``aminmax`` of a sparse tensor, and the crash was blamed on
    the model). Its rows are the incoming gradient's, copied, not rounded again: the parameter
    gets no loss-scale record (its dense twin, whose rows are summed, does: see
    ``test_emulation_fidelity``'s embedding test)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (4, 8))
    sparse = _Recommender(1e-3)
    dense = _Recommender(1e-3)
    dense.emb.sparse = False
    dense.load_state_dict(sparse.state_dict())
    report, twin = (scan(m, ids, mode="half") for m in (sparse, dense))
    assert report.status == "clean"
    assert report.loss_scale is not None and report.loss_scale.low is not None
    assert [f.code for f in twin.findings] == ["NH402"]
    assert "of emb.weight are lost in float16 without loss scaling" in twin.findings[0].message
