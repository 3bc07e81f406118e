"""Gradient log's sparse gradients: a gradient that stores no
values, a sparse one whose ids are all ``padding_idx`` (a feature missing from the whole sample
batch) or an empty parameter's, has nothing to measure; ``aminmax`` of no values raised, and the
scan failed (before an internal error; before it, "the model raised ... during backward")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.api import scan


class _TwoFeatures(nn.Module):
    """A recommender with two sparse id features; the second is padding in the whole batch."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.user = nn.Embedding(100, 8, sparse=sparse)
        self.tag = nn.Embedding(50, 8, sparse=sparse, padding_idx=0)
        self.fc = nn.Linear(8, 2)

    def forward(self, users: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
        return self.fc(self.user(users).sum(1) + self.tag(tags).sum(1))


class _EmptyParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 2)
        self.extra = nn.Parameter(torch.zeros(0, 16))  # a head with no outputs configured

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + (x @ self.extra.t()).sum()


@pytest.mark.parametrize("mode", ["half", "autocast"])
def test_a_sparse_gradient_storing_no_values_scans_as_its_dense_twin(mode: str) -> None:
    torch.manual_seed(0)
    batch = (torch.randint(0, 100, (4, 6)), torch.zeros(4, 3, dtype=torch.long))
    sparse, dense = _TwoFeatures(True), _TwoFeatures(False)
    dense.load_state_dict(sparse.state_dict())
    reports = [scan(m, batch, mode=mode) for m in (sparse, dense)]
    assert reports[0].status == reports[1].status == "clean"
    if mode == "autocast":  # FP32 embeddings: the same gradients, not rounded
        assert reports[0].loss_scale == reports[1].loss_scale
    else:  # the dense twin's summed rows are rounded, and measured; the sparse copies are not
        assert reports[0].loss_scale is not None and reports[1].loss_scale is not None
        assert reports[0].loss_scale.max_abs == reports[1].loss_scale.max_abs


@pytest.mark.parametrize("mode", ["half", "autocast"])
def test_an_empty_parameter_scans(mode: str) -> None:
    torch.manual_seed(0)
    model, x = _EmptyParameter(), torch.randn(4, 16)
    report = scan(model, x, mode=mode)
    assert report.status == "clean"
    assert report.loss_scale is not None and report.loss_scale.low is not None
