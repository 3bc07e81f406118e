"""What the distributed agreement of ``watch`` costs per DDP training step.

    python benchmarks/distributed_overhead.py --quick      # 2 gloo ranks on the CPU, ~1 minute
    python benchmarks/distributed_overhead.py               # the ~31.6M-parameter transformer
    python benchmarks/distributed_overhead.py --nproc 4 --steps 10

Without ``RANK`` in the environment the script starts itself under torchrun (``--standalone``,
``--nproc`` ranks, gloo on the CPU; NCCL when ``--device cuda``). Each rank trains two
DistributedDataParallel copies of the same model on its own batch: a plain step (forward, loss,
backward with DDP's gradient all-reduce, optimizer step, zero_grad) and the same step followed by
``w.step(batch, loss)`` of a ``watch`` over that DDP model, whose cost is the local check (loss
flag, the optimizer pre-hook's gradient reduction, one host sync) plus the agreement: one
all-reduce of a ``world_size`` int32 vector. The variants run interleaved (round-robin, the
first variant rotating each repetition) after a warm-up; each repetition times ``--steps``
steps; rank 0 prints the medians of ``--reps`` repetitions and the watched/plain ratio, and the
agreement alone (``agree()`` timed by itself, per call). Never asserted: a figure for the
README, measured in one process group against its own baseline.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from models import build_transformer  # noqa: E402


def _launch(argv: list[str], nproc: int) -> int:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc_per_node", str(nproc), str(Path(__file__).resolve()), *argv,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(command, env=env).returncode


def _loss(output: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return output.float().pow(2).mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small transformer")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (when launching)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=None, help="steps per repetition")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", type=Path, default=None, help="rank 0 writes the figures here")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        return _launch(sys.argv[1:] if argv is None else argv, args.nproc)

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from nan_hunter import watch
    from nan_hunter.training.distributed import agree, current_ranks

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    model, batch = build_transformer(quick=args.quick)
    torch.manual_seed(rank)
    batch = torch.randn_like(batch).to(device)  # each rank its own batch
    steps = args.steps or (10 if args.quick else 3)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    variants = {}
    for name in ("plain", "watched"):
        ddp = DistributedDataParallel(copy.deepcopy(model).to(device))
        optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
        watcher = watch(ddp, optimizer, loss_fn=_loss, device=args.device) if (
            name == "watched"
        ) else None
        variants[name] = (ddp, optimizer, watcher)

    def run(name: str, n: int) -> float:
        ddp, optimizer, watcher = variants[name]
        sync()
        started = time.perf_counter()
        for _ in range(n):
            loss = _loss(ddp(batch), batch)
            loss.backward()
            optimizer.step()
            if watcher is not None:
                watcher.step(batch, loss)
            optimizer.zero_grad(set_to_none=True)
        sync()
        return (time.perf_counter() - started) / n

    for _, _, watcher in variants.values():
        if watcher is not None:
            watcher.__enter__()
    try:
        for name in variants:
            run(name, 2)  # warm-up
        times: dict[str, list[float]] = {name: [] for name in variants}
        order = list(variants)
        for rep in range(args.reps):
            for name in order[rep % 2:] + order[: rep % 2]:
                times[name].append(run(name, steps))
        ranks = current_ranks()
        assert ranks is not None
        agreement = []
        for _ in range(args.reps):
            sync()
            started = time.perf_counter()
            for _ in range(50):
                agree(ranks, 0)
            agreement.append((time.perf_counter() - started) / 50)
        problems = sum(w.problems for _, _, w in variants.values() if w is not None)
    finally:
        for _, _, watcher in variants.values():
            if watcher is not None:
                watcher.close()
    if rank == 0:
        plain = statistics.median(times["plain"])
        watched = statistics.median(times["watched"])
        agree_s = statistics.median(agreement)
        figures = {
            "world_size": world,
            "device": args.device,
            "model": "transformer quick" if args.quick else "transformer 31.6M",
            "steps_per_rep": steps,
            "reps": args.reps,
            "plain_step_s": plain,
            "watched_step_s": watched,
            "ratio": watched / plain,
            "agreement_s": agree_s,
            "agreement_share_of_plain_step": agree_s / plain,
            "problems": problems,
        }
        print(
            f"{world} ranks ({args.device}, {figures['model']}): plain DDP step "
            f"{plain * 1e3:.1f} ms, watched {watched * 1e3:.1f} ms, ratio {watched / plain:.3f}; "
            f"the agreement alone {agree_s * 1e6:.0f} us per call "
            f"({agree_s / plain * 100:.2f}% of a plain step)"
        )
        if args.json is not None:
            args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
