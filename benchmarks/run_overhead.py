"""What ``nan-hunter run`` costs per training step when nothing is wrong: a small transformer
trained with and without the hooks ``run`` attaches (``nan_hunter.training.attach.ScriptWatch``).

    python benchmarks/run_overhead.py --quick            # a smoke run, under a minute
    python benchmarks/run_overhead.py --threads 1        # the figure: 200 blocks, ~5 minutes
    python benchmarks/run_overhead.py --full             # ~31.6M parameters (slow on a CPU)

A plain training loop (forward, loss, backward, optimizer step, zero_grad: the loop ``run``
meets in a script, which knows nothing of nan-hunter), without and with a GradScaler. Each
variant is ONE model, optimizer and scaler in this one process, trained in blocks of four
segments of ``--block-steps`` steps each: without the attachment (A) and with it (B, the
``ScriptWatch`` installed just before its segment's clock starts and removed after it stops,
so A runs torch's hook-free path), in ABBA order (BAAB every other block), so a drift of the
machine's speed within a block (linear in time) cancels out of the block's ratio
``(B1 + B2) / (A1 + A2)``. Printed per variant: the median of the per-block ratios, its 95%
bootstrap interval (blocks resampled), min .. max, and how many blocks. Target: a median of
at most 1.02, printed, never asserted; the interval says whether the run resolved it (an
interval reaching past 1.02 does not show the target met, one wholly above it shows it
missed). The attached work is also timed alone: the module calls of a step times what the
global hooks add to one call, plus the step check. What ``run`` adds once per process (its
process start; the torch import the script makes anyway) is not per step and not counted.

On a CPU the default is float32 without autocast: the fastest step a CPU runs, so the hooks'
share of it is the largest (``--dtype float16`` runs CPU autocast, many times slower).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from models import build_transformer  # noqa: E402

from nan_hunter.project.config import Settings, load_settings  # noqa: E402
from nan_hunter.training.attach import RunEvent, ScriptWatch  # noqa: E402

TARGET = 1.02
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class Variant:
    name: str
    scaler: bool
    ratios: list[float] = field(default_factory=list)
    """Per block: attached / plain seconds."""
    plain: list[float] = field(default_factory=list)
    """Per block: seconds per plain step."""


class Loop:
    """One variant's model, optimizer and scaler: the loop of a training script."""

    def __init__(self, variant: Variant, model: torch.nn.Module, batch: torch.Tensor,
                 dtype: torch.dtype) -> None:
        self.variant = variant
        self.model = copy.deepcopy(model)
        self.batch = batch
        self.dtype = dtype
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.scaler = torch.amp.GradScaler("cpu", enabled=variant.scaler)

    def steps(self, n: int) -> None:
        for _ in range(n):
            with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32):
                loss = self.model(self.batch).float().pow(2).mean()
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()


def hooks_alone(loop: Loop, settings: Settings) -> tuple[int, float, float]:
    """Module calls in one training step; seconds one module call gains with the global hooks
    installed (an ``nn.Identity`` called in a tight loop, with and without, best of 5); seconds
    of the step check (``ScriptWatch._before_update`` on the step's real loss and gradients).
    Timings of tight loops: far steadier on a loaded machine than whole training steps."""
    counter = [0]

    def count(module: torch.nn.Module, args: object) -> None:
        counter[0] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        loss = loop.model(loop.batch).float().pow(2).mean()
    finally:
        handle.remove()
    loss.backward()
    identity, x, n = torch.nn.Identity(), torch.zeros(1), 20_000

    def calls() -> float:
        started = time.perf_counter()
        for _ in range(n):
            identity(x)
        return (time.perf_counter() - started) / n

    watch = ScriptWatch(settings, lambda event: None)
    plain, hooked = [], []
    for _ in range(5):
        plain.append(calls())
        watch.install()
        try:
            hooked.append(calls())
        finally:
            watch.close()
    watch.saw_backward(loss)
    checks = []
    for _ in range(50):
        started = time.perf_counter()
        watch._before_update(loop.optimizer, (), {})
        checks.append(time.perf_counter() - started)
    loop.optimizer.zero_grad()
    return counter[0], max(min(hooked) - min(plain), 0.0), statistics.median(checks)


def blocks(loop: Loop, watch: ScriptWatch, n_blocks: int, k: int) -> None:
    """``n_blocks`` ABBA (BAAB every other) blocks of ``k`` steps per segment, into
    ``loop.variant``."""

    def segment(attached: bool) -> float:
        if attached:
            watch.install()
        try:
            started = time.perf_counter()
            loop.steps(k)
            return time.perf_counter() - started
        finally:
            if attached:
                watch.close()

    for b in range(n_blocks):
        order = (False, True, True, False) if b % 2 == 0 else (True, False, False, True)
        times = {False: 0.0, True: 0.0}
        for attached in order:
            times[attached] += segment(attached)
        loop.variant.ratios.append(times[True] / times[False])
        loop.variant.plain.append(times[False] / (2 * k))


def bootstrap_median(values: list[float], resamples: int = 2000,
                     seed: int = 0) -> tuple[float, float]:
    """The 95% bootstrap interval of the median of ``values`` (percentile method)."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(
        statistics.median(rng.choices(values, k=n)) for _ in range(resamples)
    )
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the 31.6M-parameter transformer")
    parser.add_argument("--blocks", type=int, default=200,
                        help="ABBA blocks per variant (default 200)")
    parser.add_argument("--block-steps", type=int, default=5,
                        help="steps per segment of a block (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 12 blocks of 2-step segments (under a minute)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--json", type=Path, default=None, help="write the measurements here")
    args = parser.parse_args(argv)
    if args.quick:
        args.blocks, args.block_steps = 12, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    model, batch = build_transformer(quick=not args.full)
    params = sum(p.numel() for p in model.parameters())
    print(f"transformer: {params / 1e6:.1f}M parameters, batch {tuple(batch.shape)}, cpu "
          f"{args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    variants = [Variant("no scaler", scaler=False), Variant("GradScaler", scaler=True)]
    problems: list[RunEvent] = []
    settings = load_settings()
    loops = [Loop(v, model, batch, dtype) for v in variants]
    watches = [ScriptWatch(settings, problems.append) for _ in loops]
    k = args.block_steps
    for loop, watch in zip(loops, watches, strict=True):  # warm-up, both paths
        blocks(loop, watch, 1, max(1, k // 2))
        loop.variant.ratios.clear()
        loop.variant.plain.clear()
    for loop, watch in zip(loops, watches, strict=True):
        blocks(loop, watch, args.blocks, k)

    print(f"run / plain per block: {args.blocks} ABBA blocks of 4 x {k} steps per variant "
          f"({4 * k * args.blocks} steps), median [95% bootstrap interval] (min .. max)")
    results = {}
    for v in variants:
        median = statistics.median(v.ratios)
        low, high = bootstrap_median(v.ratios)
        verdict = ("within target" if high <= TARGET else "above target" if low > TARGET
                   else "not resolved: the interval straddles the target")
        plain_ms = statistics.median(v.plain) * 1e3
        print(f"  {v.name:10s}: {median:.4f} [{low:.4f} .. {high:.4f}] "
              f"({min(v.ratios):.3f} .. {max(v.ratios):.3f}), {len(v.ratios)} blocks, "
              f"plain step {plain_ms:.2f} ms; target <= {TARGET}: {verdict}")
        results[v.name] = {"median": median, "ci95": [low, high], "min": min(v.ratios),
                           "max": max(v.ratios), "blocks": len(v.ratios),
                           "plain_step_ms": plain_ms}
    checked = sum(w.steps for w in watches)
    print(f"  steps checked by the attached watches: {checked}; problems: {len(problems)}")
    calls, per_call, check = hooks_alone(loops[0], settings)
    plain_ms = statistics.median(variants[0].plain) * 1e3
    added = calls * per_call + check
    print(f"  the attached work alone: {calls} module calls per step x {per_call * 1e6:.2f} us "
          f"(global hooks) + {check * 1e3:.3f} ms (the step check: loss and gradient flags, "
          f"one sync) = {added * 1e3:.3f} ms = {added * 1e3 / plain_ms:.2%} of a plain step")
    results["alone"] = {"module_calls": calls, "per_call_seconds": per_call,
                        "check_seconds": check, "share_of_plain_step": added * 1e3 / plain_ms}
    if args.json is not None:
        args.json.write_text(json.dumps({
            "full": args.full, "dtype": args.dtype, "blocks": args.blocks, "block_steps": k,
            "parameters": params, "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "ratios": {v.name: v.ratios for v in variants}, "results": results,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
