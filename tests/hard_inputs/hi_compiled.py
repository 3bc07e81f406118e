"""Hard input: ``build_model()`` returns ``torch.compile(model)``, an ``OptimizedModule``.

The scan must trace the original module (``_orig_mod``), never trigger a compilation, and report
the overflowing Linear as ``fc`` (not ``_orig_mod.fc``) at the culprit line below.
"""

import torch
from torch import nn

COMPILATIONS: list[str] = []
"""The compile backend appends here: empty as long as nothing was compiled."""


def _counting_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
    COMPILATIONS.append(type(gm).__name__)
    return gm.forward


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        with torch.no_grad():
            self.fc.weight.uniform_(50.0, 150.0)
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # <- compiled culprit


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return torch.compile(Model(), backend=_counting_backend)


def sample_batch() -> torch.Tensor:
    torch.manual_seed(0)
    return 100.0 + 100.0 * torch.rand(4, 8)
