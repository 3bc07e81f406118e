"""What ``nan_hunter.watch`` costs per training step: a mid-size transformer trained with and
without ``w.step(batch, loss)`` (and the optimizer pre-hook the watcher installs).

    python benchmarks/watch_overhead.py --quick          # small transformer, a minute or two
    python benchmarks/watch_overhead.py                  # ~31.6M parameters (slow on a CPU)
    python benchmarks/watch_overhead.py --device cuda --reps 15
    python benchmarks/watch_overhead.py --quick --threads 1   # steadier on a busy machine

Two pairs of variants, each a full training step (forward and loss under autocast, backward,
optimizer step, zero_grad): without a GradScaler (the watcher checks the gradients in the
optimizer pre-hook, one fused reduction and one sync, and the loss in ``w.step``, one sync) and
with one (the scaler's own inf check covers the gradients; ``w.step`` reads the loss and the
scale). Every variant trains its own deep copy of the same model on the same batch, so all do
identical work. Timing: the variants run interleaved in one process (round-robin, the starting
variant rotating each repetition) after a warm-up; each repetition times ``--steps`` training
steps; the median of ``--reps`` repetitions is reported with the watched/plain ratio (target
<= 1.05, printed, never asserted). The cost of the check itself (gradient reduction, loss
flag, one sync) is also timed alone, which stays readable when the machine is too noisy for a
5% difference between whole steps.

On a CPU the default is float32 (no autocast): the fastest step a CPU runs, so the watcher's
share of it is the largest; CPU FP16 and (without AMX) BF16 matmuls are many times slower and
would hide the watcher's cost behind them (``--dtype float16`` measures it anyway). On a GPU
the default is float16 autocast. The watcher's work is the same in every dtype.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from models import build_transformer  # noqa: E402

from nan_hunter.training import finite_flag, grads_finite_flag, watch  # noqa: E402

TARGET = 1.05
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def loss_fn(output: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return output.float().pow(2).mean()


@dataclass
class Variant:
    name: str
    scaler: bool
    watched: bool
    times: list[float] = field(default_factory=list)


class Trainer:
    """One variant's model, optimizer, scaler and (when watched) watcher."""

    def __init__(
        self, variant: Variant, model: torch.nn.Module, batch: torch.Tensor, device: str,
        dtype: torch.dtype, stack: contextlib.ExitStack,
    ) -> None:
        self.model = copy.deepcopy(model).to(device)
        self.batch = batch.to(device)
        self.device = device
        self.dtype = dtype
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.scaler = torch.amp.GradScaler(device, enabled=variant.scaler)
        self.watcher = None
        if variant.watched:
            self.watcher = stack.enter_context(
                watch(self.model, self.optimizer, self.scaler, loss_fn=loss_fn, device=device)
            )

    def steps(self, n: int) -> None:
        for _ in range(n):
            with _autocast(self.device, self.dtype):
                loss = loss_fn(self.model(self.batch), self.batch)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.watcher is not None:
                self.watcher.step(self.batch, loss)
            self.optimizer.zero_grad()


def _autocast(device: str, dtype: torch.dtype) -> torch.autocast:
    if dtype == torch.float32:
        return torch.autocast(device, enabled=False)
    return torch.autocast(device, dtype=dtype)


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _time_check(trainer: Trainer, sync: Callable[[], None], reps: int) -> float:
    """Median seconds of what the watcher adds to a step without a GradScaler: the gradient
    flag (as the optimizer pre-hook computes it), the loss flag, and the sync that reads both."""
    with _autocast(trainer.device, trainer.dtype):
        loss = loss_fn(trainer.model(trainer.batch), trainer.batch)
    loss.backward()
    params = list(trainer.model.parameters())
    times = []
    for _ in range(max(reps, 5) * 4):
        sync()
        started = time.perf_counter()
        grads = grads_finite_flag(params)
        flags = finite_flag([loss.detach()])
        assert grads is not None and flags is not None
        torch.stack([grads, flags]).tolist()
        times.append(time.perf_counter() - started)
    trainer.optimizer.zero_grad()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small transformer")
    parser.add_argument("--reps", type=int, default=None,
                        help="timed repetitions (default 9; 15 with --quick)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per repetition (default 3; 5 with --quick)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                        help="autocast dtype; float32: no autocast (default: float32 on a CPU, "
                        "float16 on a GPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--json", type=Path, default=None, help="write the measurements here")
    args = parser.parse_args(argv)
    reps = args.reps or (15 if args.quick else 9)
    steps = args.steps or (5 if args.quick else 3)
    dtype_name = args.dtype or ("float32" if args.device == "cpu" else "float16")
    dtype = DTYPES[dtype_name]
    if args.threads:
        torch.set_num_threads(args.threads)
    sync = _sync(args.device)

    mode = "float32, no autocast" if dtype == torch.float32 else f"autocast {dtype_name}"
    model, batch = build_transformer(quick=args.quick)
    params = sum(p.numel() for p in model.parameters())
    print(f"transformer{' (quick)' if args.quick else ''}: {params / 1e6:.1f}M parameters, "
          f"batch {tuple(batch.shape)}, {args.device} {mode}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    variants = [
        Variant("plain", scaler=False, watched=False),
        Variant("watched", scaler=False, watched=True),
        Variant("plain+scaler", scaler=True, watched=False),
        Variant("watched+scaler", scaler=True, watched=True),
    ]
    with contextlib.ExitStack() as stack:
        trainers = [Trainer(v, model, batch, args.device, dtype, stack) for v in variants]
        for trainer in trainers:  # warm-up
            trainer.steps(1)
        sync()
        for rep in range(reps):
            for i in range(len(variants)):
                k = (rep + i) % len(variants)
                sync()
                started = time.perf_counter()
                trainers[k].steps(steps)
                sync()
                variants[k].times.append((time.perf_counter() - started) / steps)
        problems = [t.watcher.problems for t in trainers if t.watcher is not None]
        check = _time_check(trainers[0], sync, reps)

    medians = {v.name: statistics.median(v.times) for v in variants}
    minima = {v.name: min(v.times) for v in variants}
    print(f"seconds per training step, {reps} reps of {steps} steps: median (min .. max)")
    for v in variants:
        spread = f"({minima[v.name] * 1e3:.1f} .. {max(v.times) * 1e3:.1f})"
        print(f"  {v.name:15s} {medians[v.name] * 1e3:9.2f} ms  {spread}")
    step_ms = medians["plain"] * 1e3
    print(f"  the check alone (gradient reduction + loss flag + one sync): {check * 1e3:.3f} ms "
          f"= {check * 1e3 / step_ms:.2%} of a plain step")
    ratios = {
        "no scaler": medians["watched"] / medians["plain"],
        "GradScaler": medians["watched+scaler"] / medians["plain+scaler"],
    }
    min_ratios = {
        "no scaler": minima["watched"] / minima["plain"],
        "GradScaler": minima["watched+scaler"] / minima["plain+scaler"],
    }
    by_name = {v.name: v.times for v in variants}
    paired = {
        label: statistics.median(w / p for w, p in zip(by_name[a], by_name[b], strict=True))
        for label, (a, b) in (("no scaler", ("watched", "plain")),
                              ("GradScaler", ("watched+scaler", "plain+scaler")))
    }
    print("  watched / plain: ratio of the medians; median of the per-repetition ratios (each "
          "from one round, robust to load drift); ratio of the minima")
    for label, ratio in ratios.items():
        verdict = "ok" if ratio <= TARGET else "above target"
        print(f"    {label:10s}  {ratio:.3f} (target <= {TARGET}: {verdict});"
              f"  paired {paired[label]:.3f};  min {min_ratios[label]:.3f}")
    if any(problems):
        print(f"  note: the watcher reported problems during the run: {problems}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "quick": args.quick, "device": args.device, "dtype": dtype_name, "reps": reps,
            "steps": steps, "parameters": params, "torch": torch.__version__,
            "times": {v.name: v.times for v in variants}, "medians": medians,
            "ratios": ratios, "paired_ratios": paired, "min_ratios": min_ratios,
            "check_seconds": check,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
