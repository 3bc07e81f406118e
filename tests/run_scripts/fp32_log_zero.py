"""An FP32 training script with a real bug: ``log`` of a feature that is 0 in one batch.

The projection's outputs reach ~1e5 (fine in FP32, beyond FP16), so a re-run in FP16 would blame
it; the run is FP32, and the NaN is the ``log(0)`` of step 3's batch.
"""

import torch
from torch import nn


class LogFeatures(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        with torch.no_grad():
            self.proj.weight.mul_(3e3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        scale = torch.log(x[:, :1])  # culprit
        return h * 1e-3 + scale


def main() -> None:
    torch.manual_seed(0)
    model = LogFeatures()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    for step in range(1, 6):
        x = torch.rand(4, 8) * 30 + 1
        if step == 3:
            x[2, 0] = 0.0
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print("done")


if __name__ == "__main__":
    main()
