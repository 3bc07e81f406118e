"""Tiny models and datasets for the framework-callback tests (``tests/test_integrations.py``).

``Tiny`` computes its own loss from ``labels``, as Hugging Face models do. Its first Linear
overflows FP16 when the inputs are large: ``OVERFLOW`` values of 3e3 times weights of ~0.75
sum to ~72000 > 65504 over 32 features, still fine in FP32: only a scan under CUDA's FP16
autocast (the pre-flight) sees it. ``EXPLODE`` (1e20) breaks the FP32 training on a CPU too
(the squared error overflows FP32): the injected fault of a run. ``dataset(bad_step=k,
value=...)`` puts such a batch at optimizer step k (batch size 1 per step, no shuffle).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

OVERFLOW = 3000.0
EXPLODE = 1e20
FEATURES = 32


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 16)
        self.fc2 = nn.Linear(16, 1)
        with torch.no_grad():
            self.fc1.weight.uniform_(0.5, 1.0)

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        h = torch.relu(self.fc1(x))  # <- overflow
        out = self.fc2(h).squeeze(-1)
        result = {"logits": out}
        if labels is not None:
            result["loss"] = (out.float() - labels).pow(2).mean()
        return result


class Rows(torch.utils.data.IterableDataset):
    """Rows in a fixed order (an iterable dataset is never shuffled): row k is step k's."""

    def __init__(self, rows: list[dict[str, torch.Tensor]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter(self.rows)


def dataset(n: int = 8, bad_step: int | None = None, value: float = EXPLODE) -> Rows:
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        x = torch.rand(FEATURES, generator=g) * 0.1
        if i == bad_step:
            x = torch.full((FEATURES,), value)
        rows.append({"x": x, "labels": torch.tensor(0.5)})
    return Rows(rows)
