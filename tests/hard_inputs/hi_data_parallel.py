"""Hard input: ``build_model()`` returns ``nn.DataParallel(model)`` (on a CPU: no device ids).

The scan must trace the wrapped module (``.module``) and report the overflowing Linear as
``encoder.1`` (not ``module.encoder.1``) at the culprit line below.
"""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)
        with torch.no_grad():
            self.encoder[1].weight.uniform_(50.0, 150.0)
            self.encoder[1].bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)  # <- data parallel culprit
        return self.head(h)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.DataParallel(Model())


def sample_batch() -> torch.Tensor:
    torch.manual_seed(0)
    return 100.0 + 100.0 * torch.rand(4, 8)
