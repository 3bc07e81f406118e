"""A torchrun (FSDP2 ``fully_shard``, gloo, CPU) script, unaware of nan-hunter: each rank on its
own batch; at step 3 one feature of rank 1's batch is 0, and the model's ``log`` of its inputs
turns it into -inf. The ranks agree and stop at that step; rank 1 gathers nothing alone: every
rank takes part in gathering the full state dict, and rank 1 re-runs its step on a plain copy
of the model built from it."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

BAD_STEP, BAD_RANK = 3, 1


class LogInputs(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)  # culprit


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(LogInputs(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    fully_shard(model[1])
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + rank)
    x = torch.rand(4, 8) + 0.5
    for step in range(1, 7):
        batch = x.clone()
        if (step, rank) == (BAD_STEP, BAD_RANK):
            batch[0, 0] = 0.0
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"rank {rank} trained")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
