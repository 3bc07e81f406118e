"""A torchrun (FSDP2 ``fully_shard``, gloo, CPU) script, unaware of nan-hunter: each rank on its
own batch; at step 3 rank 1's batch holds a NaN. A sharded model cannot be re-run on one rank
(its forward gathers parameters from the others): the ranks agree and stop, and say so."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

BAD_STEP, BAD_RANK = 3, 1


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    fully_shard(model)
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
    print(f"rank {rank} trained")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
