"""A torchrun (DDP, gloo, CPU) script, unaware of nan-hunter: the pair encoder of
``pairs_train.py`` under FP16 autocast, each rank on its own batch; at step 4 rank 1's batch is
100 times larger and its scores overflow FP16 (the all-reduce then makes every rank's gradients
NaN)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BAD_STEP, BAD_RANK = 4, 1


class PairScorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(32, 64)
        self.key = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.query(x) @ self.key(x).transpose(-2, -1)  # culprit


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(PairScorer())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)
    x = torch.randn(16, 32)
    for step in range(1, 9):
        batch = x * 100 if (step, rank) == (BAD_STEP, BAD_RANK) else x
        with torch.autocast("cpu", dtype=torch.float16):
            scores = model(batch).float()
        loss = scores.pow(2).mean() * 1e-6
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"rank {rank} trained")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
