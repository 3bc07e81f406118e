"""What the scan process (``nan_hunter.isolation``) costs: whole ``nan-hunter scan`` runs, child
process vs in-process (``NAN_HUNTER_IN_PROCESS=1``), interleaved, wall time of the CLI process.

    python benchmarks/isolation_cost.py [--runs 7] [--model examples/matrix_inverse.py]

Prints every run and the ratio of the medians (child / in-process). Run it on an idle machine:
both variants are timed in turn, so load from elsewhere hits them alike but adds noise.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(model: str, in_process: bool) -> tuple[float, float]:
    """Wall seconds of the whole CLI process, and CPU seconds of it and its scan process."""
    env = {**os.environ}
    env.pop("NAN_HUNTER_IN_PROCESS", None)
    if in_process:
        env["NAN_HUNTER_IN_PROCESS"] = "1"
    command = shutil.which("nan-hunter")
    boot = [sys.executable, "-c", "from nan_hunter.cli import main; main()"]
    args = [command] if command else boot
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [*args, "scan", model, "--format", "json"], env=env, capture_output=True, cwd=ROOT
    )
    seconds = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)  # the CLI and its scan process
    cpu = (now.ru_utime + now.ru_stime) - (used.ru_utime + used.ru_stime)
    if done.returncode not in (0, 1):
        raise SystemExit(f"scan failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--model", default="examples/matrix_inverse.py")
    options = parser.parse_args()
    run_once(options.model, True)  # warm the file cache
    times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i in range(options.runs):
        for in_process in ((True, False) if i % 2 == 0 else (False, True)):
            times[in_process].append(run_once(options.model, in_process))
        (w1, c1), (w2, c2) = times[True][-1], times[False][-1]
        print(f"run {i + 1}: in-process {w1:.2f} s (cpu {c1:.2f} s), "
              f"child {w2:.2f} s (cpu {c2:.2f} s)", flush=True)
    for k, what in ((0, "wall"), (1, "cpu")):
        here = statistics.median(t[k] for t in times[True])
        child = statistics.median(t[k] for t in times[False])
        print(f"{what}: median in-process {here:.2f} s, child process {child:.2f} s, "
              f"ratio {child / here:.2f}")


if __name__ == "__main__":
    main()
