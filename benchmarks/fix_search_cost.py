"""How many re-scans the fix search costs per finding, on the fixtures and the examples.

Every verification of a candidate patch (one fix, or a group of independent fixes) is one
re-scan of a patched copy of the project (``nan_hunter.fixes.verify.overlay``). This scans each
model file with a fixable error in-process, in autocast and in half mode, counts the re-scans
and divides by the error findings that got a fix with edits, then prints per file, and the
median and worst over all of them.

    python benchmarks/fix_search_cost.py            # tests/fixtures/fx_*.py + examples/*.py
    python benchmarks/fix_search_cost.py --json     # one JSON object, for a note or a plot
    python benchmarks/fix_search_cost.py --ladder   # as before issue 36: the first rung that
                                                    # verifies, no op-alone candidate

Beside the re-scans, each fixed finding's chosen fix's cost: the share of the model's
matmul/conv FLOPs (and elementwise work) it moves to FP32 (``nan_hunter.fixes.cost``).

A re-scan's cost is about one scan (``benchmarks/verification.py`` times them); the count is the
figure that grows with the search, so it is what this reports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nan_hunter.fixes.build as build  # noqa: E402
import nan_hunter.fixes.cost as cost  # noqa: E402
import nan_hunter.fixes.verify as verify  # noqa: E402
from nan_hunter.api import scan_file  # noqa: E402
from nan_hunter.errors import NanHunterError  # noqa: E402
from nan_hunter.project.config import load_settings  # noqa: E402


@contextlib.contextmanager
def counted_rescans() -> Iterator[list[int]]:
    """Count the re-scans (overlays of a patched project) made inside the block."""
    count = [0]
    original = verify.overlay

    @contextlib.contextmanager
    def overlay(*args: Any, **kwargs: Any) -> Iterator[Any]:
        count[0] += 1
        with original(*args, **kwargs) as value:
            yield value

    verify.overlay = overlay  # type: ignore[assignment]
    try:
        yield count
    finally:
        verify.overlay = original  # type: ignore[assignment]


@contextlib.contextmanager
def first_rung() -> Iterator[None]:
    """The search before issue 36: no op-alone candidate, the first candidate that verifies
    (in ladder order) kept, nothing tried after it."""
    saved = build._op_alone, verify.covers, cost.rank
    build._op_alone = lambda *args, **kwargs: None  # type: ignore[assignment]
    verify.covers = lambda wider, narrower: True  # type: ignore[assignment]
    cost.rank = lambda fix: (cost.safety(fix), 0.0, 0.0, 0)  # type: ignore[assignment]
    try:
        yield
    finally:
        build._op_alone, verify.covers, cost.rank = saved  # type: ignore[assignment]


def _chosen_cost(fix: Any) -> tuple[float, float] | None:
    chosen = next((f for f in (fix, *fix.alternatives) if f.verified and f.edits), None)
    if chosen is None or chosen.cost is None:
        return None
    return (round(chosen.cost.added_matmul_share, 4),
            round(chosen.cost.added_elementwise_share, 4))


def measure(path: Path, mode: str) -> dict[str, Any] | None:
    with counted_rescans() as count:
        try:
            report = scan_file(str(path), load_settings(overrides={"mode": mode}))
        except NanHunterError:
            return None  # a fixture that does not run in this mode (or is a bad input)
    fixable = [f for f in report.findings if f.is_error and f.fix is not None and f.fix.edits]
    if not fixable:
        return None
    return {
        "file": str(path.relative_to(ROOT)),
        "mode": mode,
        "findings": len(fixable),
        "rescans": count[0],
        "per_finding": count[0] / len(fixable),
        "costs": [_chosen_cost(f.fix) for f in fixable],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--ladder", action="store_true", help="the search before issue 36")
    parser.add_argument("--only", help="files whose name contains this")
    args = parser.parse_args()
    files = sorted((ROOT / "tests" / "fixtures").glob("fx_*.py")) + sorted(
        (ROOT / "examples").glob("*.py")
    )
    files = [f for f in files if args.only is None or args.only in f.name]
    with first_rung() if args.ladder else contextlib.nullcontext():
        rows = [r for f in files for mode in ("autocast", "half") if (r := measure(f, mode))]
    per = [r["per_finding"] for r in rows]
    summary = {
        "models": len(rows),
        "median_per_finding": statistics.median(per),
        "worst_per_finding": max(per),
        "worst": max(rows, key=lambda r: r["per_finding"])["file"],
    }
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
        return 0
    for r in rows:
        costs = ", ".join(
            "-" if c is None else f"{c[0] * 100:.1f}%/{c[1] * 100:.1f}%" for c in r["costs"]
        )
        print(f"{r['file']:45s} {r['mode']:8s} findings {r['findings']}  re-scans "
              f"{r['rescans']:2d}  per finding {r['per_finding']:.1f}  moved to FP32 "
              f"(matmul/elementwise) {costs}")
    print(f"\n{summary['models']} scans with a fixable error: re-scans per finding median "
          f"{summary['median_per_finding']:.1f}, worst {summary['worst_per_finding']:.1f} "
          f"({summary['worst']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
