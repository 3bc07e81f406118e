"""A small, well-behaved MLP classifier: FP16 autocast changes nothing that matters.

Linear -> BatchNorm1d -> GELU -> Linear -> LayerNorm -> GELU -> Linear, trained with
cross-entropy. All activations stay around 1, far inside FP16's range (6.1e-5 .. 65504), so a
scan should report no error. Use it as the "nothing to see here" baseline.

Batch: a tuple ``(x, targets)`` passed positionally, ``x`` a (8, 16) FP32 tensor and
``targets`` a (8,) int64 tensor of class indices in [0, 4). The model accepts ``targets`` and
ignores it; ``loss_fn`` uses it.
"""

import torch
import torch.nn.functional as F
from torch import nn

N_FEATURES = 16
HIDDEN = 32
N_CLASSES = 4
BATCH = 8


class ClassifierMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(N_FEATURES, HIDDEN)
        self.bn = nn.BatchNorm1d(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, N_CLASSES)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        h = F.gelu(self.bn(self.fc1(x)))
        h = F.gelu(self.norm(self.fc2(h)))
        return self.head(h)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return ClassifierMLP()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(BATCH, N_FEATURES)
    targets = torch.randint(0, N_CLASSES, (BATCH,))
    return x, targets


def loss_fn(output: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    _, targets = batch
    return F.cross_entropy(output.float(), targets)
