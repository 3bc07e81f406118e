"""What the range map (headroom per module, the ``closest`` ops) adds to a scan, as a ratio
against the same scan without it, in the same run.

    python benchmarks/headroom_cost.py              # ophavy and transformer, quick sizes
    python benchmarks/headroom_cost.py --models ophavy --reps 9 --full

Two measurements per model:

- **direct**: ``build_range_map`` timed on the events of the scan's own low-precision pass
  (repeated until it takes 0.2 s, then divided), over the median time of a whole scan;
- **A/B**: whole scans with the map and with ``build_range_map`` replaced by a stub returning
  None, interleaved (A, B, A, B, ...); the ratio of the medians. On a busy 2-core machine this
  is noise-bound (a few percent either way); the direct ratio is the figure to read.

The target is under 2% (issue 25). Nothing is asserted: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models

import nan_hunter
from nan_hunter.engine import runner
from nan_hunter.engine import scan as engine
from nan_hunter.engine.range_map import build_range_map
from nan_hunter.precision.formats import FP16


def _scan(model: Any, batch: Any) -> float:
    started = time.perf_counter()
    nan_hunter.scan(model, batch, verify_fixes=False)
    return time.perf_counter() - started


def _captured_pass(model: Any, batch: Any) -> Any:
    """The low-precision pass of one scan that traced most (the loss-scale window's extra
    passes trace no backward node)."""
    seen: list[Any] = []
    original = runner.PassRunner.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if result.events:
            seen.append(result)
        return result

    runner.PassRunner.run = run  # type: ignore[method-assign]
    try:
        nan_hunter.scan(model, batch, verify_fixes=False)
    finally:
        runner.PassRunner.run = original  # type: ignore[method-assign]
    return max(seen, key=lambda r: (len(r.grad_events), len(r.events)))


def _builder_seconds(low: Any) -> float:
    reps, started = 0, time.perf_counter()
    while time.perf_counter() - started < 0.2:
        build_range_map(low.events, low.grad_events, FP16, 65536.0)
        reps += 1
    return (time.perf_counter() - started) / reps


def measure(name: str, *, quick: bool, reps: int) -> dict[str, float]:
    model, batch = getattr(models, f"build_{name.replace('-', '_')}")(quick)
    _scan(model, batch)  # warm-up
    low = _captured_pass(model, batch)
    with_map, without = [], []
    for _ in range(reps):
        with_map.append(_scan(model, batch))
        engine.build_range_map = lambda *a, **k: None  # type: ignore[assignment,misc]
        try:
            without.append(_scan(model, batch))
        finally:
            engine.build_range_map = build_range_map
    builder = _builder_seconds(low)
    scan = statistics.median(with_map)
    return {
        "ops": len(low.events),
        "backward_nodes": len(low.grad_events),
        "scan_s": scan,
        "builder_ms": builder * 1e3,
        "direct_ratio": 1 + builder / scan,
        "ab_ratio": scan / statistics.median(without),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["ophavy", "transformer"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--full", action="store_true", help="full-size models (slow)")
    args = parser.parse_args()
    print(f"{'model':<12} {'ops':>6} {'bwd':>6} {'scan s':>8} {'map ms':>8} "
          f"{'direct':>8} {'A/B':>8}")
    for name in args.models:
        r = measure(name, quick=not args.full, reps=args.reps)
        print(f"{name:<12} {r['ops']:>6.0f} {r['backward_nodes']:>6.0f} {r['scan_s']:>8.3f} "
              f"{r['builder_ms']:>8.3f} {r['direct_ratio']:>8.4f} {r['ab_ratio']:>8.4f}")
    print("target: the map adds under 2% to a scan (direct ratio < 1.02)")


if __name__ == "__main__":
    main()
