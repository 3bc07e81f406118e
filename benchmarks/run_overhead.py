"""What ``nan-hunter run`` costs per training step when nothing is wrong: a small transformer
trained with and without the hooks ``run`` attaches (``nan_hunter.training.attach.ScriptWatch``).

    python benchmarks/run_overhead.py                    # small transformer, a minute or two
    python benchmarks/run_overhead.py --threads 1        # steadier on a busy machine
    python benchmarks/run_overhead.py --full             # ~31.6M parameters (slow on a CPU)

A plain training loop (forward, loss, backward, optimizer step, zero_grad: the loop ``run``
meets in a script, which knows nothing of nan-hunter), with and without a GradScaler. Each pair
trains two deep copies of the same model on the same batch: "plain" with nothing attached,
"run" with the ``ScriptWatch`` that ``nan-hunter run`` installs (global module forward hooks,
the optimizer step pre/post hooks, ``Tensor.backward`` and ``GradScaler.step``/``update``
wrapped) installed for its repetition and removed after it, so the plain copy runs torch's hook-
free path. The variants run interleaved, round-robin with a rotating start, after a warm-up;
each repetition times ``--steps`` steps. Printed per pair: the median of the per-repetition
ratios run/plain with its spread (interquartile range, min .. max), and the ratio of the
medians. Target <= 1.02, printed, never asserted. On a loaded machine whole steps vary by more
than 2% from one repetition to the next, so the attached work is also timed alone: the module
calls of a step times what the global hooks add to one call, plus the step check. What ``run``
adds once per process (its process start; the torch import the script makes anyway) is not per
step and not counted.

On a CPU the default is float32 without autocast: the fastest step a CPU runs, so the hooks'
share of it is the largest (``--dtype float16`` runs CPU autocast, many times slower).
"""

from __future__ import annotations

import argparse
import copy
import json
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

from nan_hunter.config import Settings, load_settings  # noqa: E402
from nan_hunter.training.attach import RunEvent, ScriptWatch  # noqa: E402

TARGET = 1.02
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class Variant:
    name: str
    scaler: bool
    attached: bool
    times: list[float] = field(default_factory=list)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the 31.6M-parameter transformer")
    parser.add_argument("--reps", type=int, default=101, help="timed repetitions (default 101)")
    parser.add_argument("--steps", type=int, default=1, help="steps per repetition (default 1)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--json", type=Path, default=None, help="write the measurements here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    model, batch = build_transformer(quick=not args.full)
    params = sum(p.numel() for p in model.parameters())
    print(f"transformer: {params / 1e6:.1f}M parameters, batch {tuple(batch.shape)}, cpu "
          f"{args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    variants = [
        Variant("plain", scaler=False, attached=False),
        Variant("run", scaler=False, attached=True),
        Variant("plain+scaler", scaler=True, attached=False),
        Variant("run+scaler", scaler=True, attached=True),
    ]
    problems: list[RunEvent] = []
    settings = load_settings()
    loops = [Loop(v, model, batch, dtype) for v in variants]
    watches = {id(loop): ScriptWatch(settings, problems.append) for loop in loops}

    def timed(loop: Loop, n: int) -> float:
        watch = watches[id(loop)] if loop.variant.attached else None
        if watch is not None:
            watch.install()
        try:
            started = time.perf_counter()
            loop.steps(n)
            return (time.perf_counter() - started) / n
        finally:
            if watch is not None:
                watch.close()

    for loop in loops:  # warm-up
        timed(loop, 2)
    for rep in range(args.reps):
        for i in range(len(loops)):
            k = (rep + i) % len(loops)
            variants[k].times.append(timed(loops[k], args.steps))

    checked = sum(w.steps for w in watches.values())
    print(f"seconds per training step, {args.reps} reps of {args.steps} steps: "
          "median (min .. max)")
    for v in variants:
        print(f"  {v.name:13s} {statistics.median(v.times) * 1e3:8.2f} ms  "
              f"({min(v.times) * 1e3:.1f} .. {max(v.times) * 1e3:.1f})")
    results = {}
    for label, (a, b) in (("no scaler", ("run", "plain")),
                          ("GradScaler", ("run+scaler", "plain+scaler"))):
        ta = next(v.times for v in variants if v.name == a)
        tb = next(v.times for v in variants if v.name == b)
        paired = [x / y for x, y in zip(ta, tb, strict=True)]
        q1, median, q3 = statistics.quantiles(paired, n=4)
        of_medians = statistics.median(ta) / statistics.median(tb)
        verdict = "ok" if median <= TARGET else "above target"
        print(f"  run / plain, {label:10s}: paired median {median:.3f} (IQR {q1:.3f} .. "
              f"{q3:.3f}, min {min(paired):.3f} .. max {max(paired):.3f}); ratio of the "
              f"medians {of_medians:.3f}; target <= {TARGET}: {verdict}")
        results[label] = {"paired_median": median, "q1": q1, "q3": q3, "min": min(paired),
                          "max": max(paired), "ratio_of_medians": of_medians}
    print(f"  steps checked by the attached watches: {checked}; problems: {len(problems)}")
    calls, per_call, check = hooks_alone(loops[0], settings)
    plain_ms = statistics.median(variants[0].times) * 1e3
    added = calls * per_call + check
    print(f"  the attached work alone: {calls} module calls per step x {per_call * 1e6:.2f} us "
          f"(global hooks) + {check * 1e3:.3f} ms (the step check: loss and gradient flags, "
          f"one sync) = {added * 1e3:.3f} ms = {added * 1e3 / plain_ms:.2%} of a plain step")
    results["alone"] = {"module_calls": calls, "per_call_seconds": per_call,
                        "check_seconds": check, "share_of_plain_step": added * 1e3 / plain_ms}
    if args.json is not None:
        args.json.write_text(json.dumps({
            "full": args.full, "dtype": args.dtype, "reps": args.reps, "steps": args.steps,
            "parameters": params, "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "times": {v.name: v.times for v in variants}, "ratios": results,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
