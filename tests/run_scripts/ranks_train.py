"""A torchrun (gloo, CPU) script, unaware of nan-hunter, whose ranks train models of their own
(no DDP: nothing spreads a NaN from one rank to another) and meet once a step in an all-reduce of
their losses, for logging. Rank 1's batch of step 3 holds a NaN."""

import torch
import torch.distributed as dist
from torch import nn

BAD_STEP, BAD_RANK = 3, 1


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + rank)
    x = torch.randn(4, 8)
    for step in range(1, 7):
        batch = x.clone()
        if (step, rank) == (BAD_STEP, BAD_RANK):
            batch[0, 0] = float("nan")
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # every rank, every step
    print(f"rank {rank} trained")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
