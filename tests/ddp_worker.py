"""One rank of the distributed watch test (``tests/test_distributed.py`` runs it with torchrun).

DDP on gloo (CPU), gradient accumulation over two micro-batches with the first under
``no_sync()``; rank 1's first micro-batch of optimizer step ``BAD_STEP`` holds a NaN. Each rank
writes what it saw to ``OUT/rank{r}.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nan_hunter import TrainingProblem, watch

BAD_STEP = 3
BAD_RANK = 1
ACCUMULATE = 2


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc(x)))


def batch(rank: int, step: int, micro: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    x = torch.randn(4, 8, generator=g)
    if (rank, step, micro) == (BAD_RANK, BAD_STEP, 0):
        x[0, 0] = float("nan")
    return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--on-problem", choices=["stop", "raise"], required=True)
    parser.add_argument("--report-to", choices=["rank0", "all"], default="rank0")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(Model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = 0
    seen: dict[str, object] = {"rank": rank, "stopped_at": None, "raised_at": None}
    started = time.perf_counter()
    try:
        with watch(
            model, optimizer, on_problem=args.on_problem, device="cpu",
            report_to=args.report_to, output=args.out / "nan.json",
        ) as w:
            for step in range(8):
                for micro in range(ACCUMULATE):
                    x = batch(rank, step, micro)
                    sync = model.no_sync() if micro < ACCUMULATE - 1 else contextlib.nullcontext()
                    with sync:
                        loss = model(x).pow(2).mean()
                        loss.backward()
                    calls += 1
                    w.step(x, loss)
                    if w.stopped:
                        break
                if w.stopped:
                    seen["stopped_at"] = calls - 1
                    break
                optimizer.step()
                optimizer.zero_grad()
    except TrainingProblem as exc:
        seen["raised_at"] = exc.event.step
        seen["message"] = str(exc)
    seen["seconds"] = time.perf_counter() - started
    seen["calls"] = calls
    seen["events"] = [
        {
            "step": e.step,
            "rank": e.rank,
            "world_size": e.world_size,
            "origin_rank": e.origin_rank,
            "reason": e.reason.value,
            "codes": [f.code for f in e.report.findings] if e.report else None,
            "report_path": e.report_path,
        }
        for e in w.reports
    ]
    (args.out / f"rank{rank}.json").write_text(json.dumps(seen), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
