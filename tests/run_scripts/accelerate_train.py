"""An accelerate script, unaware of nan-hunter: the pair encoder of ``pairs_train.py`` through
``Accelerator.prepare`` and ``accelerator.backward``, its forward under FP16 autocast on the CPU,
without a GradScaler. The matmul overflows FP16 at step 7."""

import torch
from accelerate import Accelerator
from torch import nn


class PairScorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(32, 64)
        self.key = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.query(x) @ self.key(x).transpose(-2, -1)  # culprit


def main() -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = PairScorer()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    torch.manual_seed(1)
    x = torch.randn(16, 32)
    for _ in range(20):
        with torch.autocast("cpu", dtype=torch.float16):
            scores = model(x).float()
        loss = 1e-5 * scores.pow(2).mean() - scores.diagonal().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print("trained")


if __name__ == "__main__":
    main()
