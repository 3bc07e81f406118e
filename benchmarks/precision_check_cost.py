"""What the precision check adds to a BF16 scan: ``precision_check="off"`` against ``"on"``.

    python benchmarks/precision_check_cost.py --threads 1 --clock cpu   # both shapes, ~5 min
    python benchmarks/precision_check_cost.py --model transformer --rounds 7 --threads 1
    python benchmarks/precision_check_cost.py --model gpt2-medium --rounds 2
    python benchmarks/precision_check_cost.py --quick               # small shapes, ~15 s
    python benchmarks/precision_check_cost.py --baseline /tmp/nh_base   # before/after

In one process, per model: one untimed warm-up of every variant, then ``--rounds`` ABBA blocks
(``off on fp32 fp32 on off``; with ``--baseline DIR``, that checkout's scans too), the variant
a block starts with rotating from block to block. Each block gives one ratio per pair, the sum
of its two ``on`` times over its two ``off`` times, so that drift and another process's load
hit both alike; the median ratio is printed with the min..max over the blocks, beside the
median times. ``fp32`` (a plain FP32 forward + backward of the same model, timed in the same
blocks) is the floor of any check that compares with an FP32 step: ``(off + fp32) / off``.

Every ``on`` scan's verdict (loss error, gradient cosine, ops compared, largest op error) is
checked to be the same in every round, and printed.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import BUILDERS
from overhead import forward_backward
from speed import load_baseline

ROUNDS = {"transformer": 5, "gpt2-medium": 2}
"""Default ABBA blocks per model (GPT-2 medium's scan takes tens of seconds on 2 cores)."""


def _verdict(report: Any) -> tuple[Any, ...] | None:
    v = report.precision_check
    if v is None:
        return None
    return (v.loss_error, v.grad_cosine, v.compared, v.largest_error, v.largest_at, v.complete)


def variants(baseline: Any | None) -> dict[str, Callable[..., Any]]:
    from nan_hunter.api import scan

    found: dict[str, Callable[..., Any]] = {
        "off": lambda m, b: scan(m, b, dtype="bfloat16", precision_check="off"),
        "on": lambda m, b: scan(m, b, dtype="bfloat16", precision_check="on"),
    }
    if baseline is not None:
        found["base-on"] = lambda m, b: baseline(m, b, dtype="bfloat16", precision_check="on")
        found["base-off"] = lambda m, b: baseline(m, b, dtype="bfloat16", precision_check="off")
    found["fp32"] = forward_backward
    return found


def time_model(
    name: str, calls: dict[str, Callable[..., Any]], rounds: int, clock: Callable[[], float],
    quick: bool,
) -> dict[str, Any]:
    model, batch = BUILDERS[name](quick)
    times: dict[str, list[float]] = {k: [] for k in calls}
    verdicts: dict[str, set[tuple[Any, ...] | None]] = {k: set() for k in calls}
    for key, call in calls.items():  # warm-up
        out = call(model, batch)
        if key != "fp32":
            verdicts[key].add(_verdict(out))
    for block in range(rounds):
        block_times: dict[str, float] = dict.fromkeys(calls, 0.0)
        start = block % len(calls)  # which variant a block starts (and ends) with rotates
        order = list(calls)[start:] + list(calls)[:start]
        for key in order + order[::-1]:  # ABBA
            gc.collect()
            t0 = clock()
            out = calls[key](model, batch)
            block_times[key] += clock() - t0
            if key != "fp32":
                verdicts[key].add(_verdict(out))
        for key, t in block_times.items():
            times[key].append(t / 2)
        print(f"  {name} block {block + 1}: "
              + ", ".join(f"{k} {t / 2:.2f} s" for k, t in block_times.items())
              + f"; on/off {block_times['on'] / block_times['off']:.2f}", flush=True)
    return {"model": name, "times": times,
            "verdicts": {k: sorted(map(str, v)) for k, v in verdicts.items() if k != "fp32"}}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}..{max(values):.2f}]"


def _ratios(result: dict[str, Any], a: str, b: str) -> list[float]:
    return [x / y for x, y in zip(result["times"][a], result["times"][b], strict=True)]


def report(result: dict[str, Any]) -> None:
    times = result["times"]
    print(f"\n{result['model']}: median " + ", ".join(
        f"{k} {statistics.median(t):.2f} s" for k, t in times.items()
    ))  # fmt: skip
    print(f"  on/off {_spread(_ratios(result, 'on', 'off'))}  (target: under 1.15x)")
    if "base-on" in times:
        print(f"  base-on/base-off {_spread(_ratios(result, 'base-on', 'base-off'))}"
              f"  on/base-on {_spread(_ratios(result, 'on', 'base-on'))}"
              f"  off/base-off {_spread(_ratios(result, 'off', 'base-off'))}")
    floor = [(o + f) / o for o, f in zip(times["off"], times["fp32"], strict=True)]
    print(f"  floor (off + fp32)/off {_spread(floor)}; fp32/off "
          f"{_spread(_ratios(result, 'fp32', 'off'))}")
    for key, seen in result["verdicts"].items():
        same = "same in every run" if len(seen) == 1 else f"{len(seen)} DIFFERENT verdicts"
        print(f"  {key} verdict ({same}): {seen[0] if len(seen) == 1 else seen}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("transformer", "gpt2-medium", "both"),
                        default="both")
    parser.add_argument("--rounds", type=int, default=None,
                        help="ABBA blocks per model (default: 5 transformer, 2 gpt2-medium; "
                        "1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="small shapes, 1 block")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall clock (default) or this process's CPU time")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="also time the scans of the nan_hunter package in checkout DIR")
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    baseline = load_baseline(args.baseline) if args.baseline else None
    calls = variants(baseline)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    names = ["transformer", "gpt2-medium"] if args.model == "both" else [args.model]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, clock {args.clock}, "
          f"variants {', '.join(calls)}")
    results = []
    for name in names:
        rounds = args.rounds or (1 if args.quick else ROUNDS[name])
        result = time_model(name, calls, rounds, clock, args.quick)
        report(result)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
