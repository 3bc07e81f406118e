"""What verifying fixes costs: whole ``nan-hunter scan MODEL --format json`` processes, as users
run them, on a model with four independent FP16 overflows (``tests/fixtures/batch/four_heads.py``).

Variants, each one child process ``python -m nan_hunter scan FILE --format json``:

- ``verify``: the four-findings model with the default settings (every fix verified);
- ``no-verify``: the same with ``--no-verify``;
- ``clean``: the same model with all four fixes applied (written once, at the start, by this
  checkout's ``scan --fix``), which scans clean: the time a scan costs without findings.

With ``--baseline DIR`` (a checkout or an exported commit holding ``nan_hunter/`` and
``configs/``), every variant also runs against that package (``PYTHONPATH=DIR``), interleaved with
this checkout's runs, so that before and after are measured under the same load. Repetition
rounds run every variant once, in an order rotated per round, after one warm-up round; each
round's ratios are taken within the round, and reported as medians with min-max.

    python benchmarks/verification.py                       # this checkout only
    rev=6c46c9f; snap=/tmp/nh_$rev; mkdir -p $snap
    git archive $rev nan_hunter configs | tar -x -C $snap   # a fixed commit, as speed.py does
    python benchmarks/verification.py --baseline $snap      # before/after in one run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "tests" / "fixtures" / "batch" / "four_heads.py"
SIZES = {"fixture": (16, 8, 1), "medium": (512, 1024, 4), "large": (1024, 2048, 4)}
"""``WIDTH, ROWS, DEPTH`` of the model (features, batch rows, trunk layers per stage)."""
VARIANTS = ("verify", "no-verify", "clean")
TARGET = 2.0
"""The issue's target: the full CLI run including verification / its clean-scan time."""


def run_cli(package: Path, folder: Path, extra: list[str], threads: int | None) -> dict[str, Any]:
    """One ``nan-hunter scan`` child process with ``package`` first on ``PYTHONPATH``: wall and
    CPU seconds, exit code, and what its JSON report says about the fixes."""
    env = dict(os.environ, PYTHONPATH=str(package))
    env.pop("NAN_HUNTER_IN_PROCESS", None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "nan_hunter", "scan", "four_heads.py", "--format", "json", *extra],
        cwd=folder, env=env, capture_output=True, text=True, check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        raise SystemExit(f"scan failed ({done.returncode}) in {folder}:\n{done.stderr}")
    report = json.loads(done.stdout)
    fixes = [f["fix"] for f in report["findings"] if f.get("fix")]
    return {
        "wall": wall,
        "cpu": cpu,
        "exit": done.returncode,
        "errors": report["summary"]["errors"],
        "verified": sum(1 for f in fixes if f.get("verified") is True),
    }


def package_of(checkout: Path) -> Path:
    if not (checkout / "nan_hunter" / "__init__.py").is_file():
        raise SystemExit(f"--baseline: no nan_hunter package in {checkout}")
    probe = subprocess.run(  # from a neutral folder: python puts the working folder first
        [sys.executable, "-c", "import nan_hunter; print(nan_hunter.__file__)"],
        env=dict(os.environ, PYTHONPATH=str(checkout)), capture_output=True, text=True,
        check=True, cwd=tempfile.gettempdir(),
    )
    imported = Path(probe.stdout.strip()).resolve()
    if not imported.is_relative_to(checkout.resolve()):
        raise SystemExit(f"PYTHONPATH={checkout} imports nan_hunter from {imported}")
    return checkout


def prepare(work: Path, size: str, threads: int | None) -> dict[str, Path]:
    """Folders with the four-findings model (at ``size``) and with its fixed (clean) copy."""
    dirty, clean = work / "findings", work / "clean"
    text = MODEL.read_text(encoding="utf-8")
    line = "WIDTH, ROWS, DEPTH = 16, 8, 1\n"
    if line not in text:
        raise SystemExit(f"{MODEL} has no line {line!r} to scale")
    text = text.replace(line, "WIDTH, ROWS, DEPTH = {}, {}, {}\n".format(*SIZES[size]))
    for folder in (dirty, clean):
        folder.mkdir()
        (folder / "four_heads.py").write_text(text, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    subprocess.run(
        [sys.executable, "-m", "nan_hunter", "scan", "four_heads.py", "--fix", "--no-backup",
         "--format", "json"],
        cwd=clean, env=env, capture_output=True, text=True, check=False,
    )
    check = run_cli(ROOT, clean, ["--no-verify"], threads)
    if check["errors"]:
        raise SystemExit(f"the fixed copy still has {check['errors']} error(s): {clean}")
    return {"verify": dirty, "no-verify": dirty, "clean": clean}


def _spread(values: list[float], unit: str = "x") -> str:
    return f"{statistics.median(values):6.2f}{unit} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="a checkout (or exported commit) to measure beside this one")
    parser.add_argument("--reps", type=int, default=3, help="repetition rounds (default 3)")
    parser.add_argument("--size", choices=sorted(SIZES), default="medium",
                        help="model size: WIDTH, ROWS, DEPTH of the model (default medium)")
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS for the scan processes (default 1; 0: unset)")
    parser.add_argument("--json", type=Path, default=None, help="also write every measurement")
    args = parser.parse_args(argv)

    packages = {"after": package_of(ROOT)}
    if args.baseline is not None:
        packages["before"] = package_of(args.baseline)
    work = Path(tempfile.mkdtemp(prefix="nh_verification_"))
    try:
        folders = prepare(work, args.size, args.threads)
        runs = [(side, v) for side in packages for v in VARIANTS]
        extra = {"verify": [], "no-verify": ["--no-verify"], "clean": []}
        results: dict[tuple[str, str], list[dict[str, Any]]] = {r: [] for r in runs}
        for round_ in range(args.reps + 1):  # round 0: warm-up, not kept
            shift = round_ % len(runs)
            for side, variant in runs[shift:] + runs[:shift]:
                measured = run_cli(packages[side], folders[variant], extra[variant], args.threads)
                if round_:
                    results[(side, variant)].append(measured)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"model: {MODEL.relative_to(ROOT)} (4 independent findings), size {args.size} "
          "(WIDTH, ROWS, DEPTH = {}, {}, {}); ".format(*SIZES[args.size])
          + f"{args.reps} rounds of whole `python -m nan_hunter scan FILE --format json` "
          f"processes, OMP_NUM_THREADS={args.threads or 'unset'}")
    for side, package in packages.items():
        print(f"\n{side}: nan_hunter from {package}")
        for variant in VARIANTS:
            rows = results[(side, variant)]
            last = rows[-1]
            print(f"  {variant:<9} wall {_spread([r['wall'] for r in rows], ' s')}  "
                  f"cpu {_spread([r['cpu'] for r in rows], ' s')}  exit {last['exit']}  "
                  f"errors {last['errors']}  fixes verified {last['verified']}")
        for num, den in (("verify", "clean"), ("no-verify", "clean"), ("verify", "no-verify")):
            per_round = [
                a["wall"] / b["wall"]
                for a, b in zip(results[(side, num)], results[(side, den)], strict=True)
            ]
            note = f"   (target <= {TARGET:g}x)" if (num, den) == ("verify", "clean") else ""
            print(f"  {num} / {den}: {_spread(per_round)}{note}")
    if "before" in packages:
        print("\nafter / before (same variant, same round, wall time):")
        for variant in VARIANTS:
            per_round = [
                a["wall"] / b["wall"]
                for a, b in zip(
                    results[("after", variant)], results[("before", variant)], strict=True
                )
            ]
            print(f"  {variant:<9} {_spread(per_round)}")
    if args.json is not None:
        args.json.write_text(json.dumps(
            {f"{s}/{v}": rows for (s, v), rows in results.items()}, indent=1
        ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
