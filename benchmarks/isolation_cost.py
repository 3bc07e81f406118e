"""What a whole ``nan-hunter scan`` costs as a user runs it: the CLI process with its scan process
(``nan_hunter.process.isolation``), against the same scan in-process (``NAN_HUNTER_IN_PROCESS=1``),
against a plain FP32 forward + backward process of the same model file (``fp32``: import torch,
build the model and batch, one step with the scan's default loss), and, with ``--baseline DIR``,
against the CLI of another checkout (before/after), interleaved, wall and CPU time of the
processes.

    python benchmarks/isolation_cost.py [--runs 7] [--model examples/matrix_inverse.py]
    python benchmarks/isolation_cost.py --model benchmarks/transformer_model.py --threads 1
    python benchmarks/isolation_cost.py --baseline /tmp/base   # a checkout's nan_hunter/ + configs/

Prints every run and the ratios of the medians. Every variant runs from a temporary working
folder (so that the checkout it is started in does not shadow the one measured), on the model's
absolute path. Run it on an idle machine: the variants are timed in turn, so load from elsewhere
hits them alike but adds noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLAIN_STEP = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("model_file", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.path.insert(0, sys.argv[2])
spec.loader.exec_module(module)
model, batch = module.build_model(), module.sample_batch()
out = model(*batch) if isinstance(batch, (tuple, list)) else model(batch)
leaves = out if isinstance(out, (tuple, list)) else (out,)
loss = torch.stack([t.float().mean() for t in leaves if torch.is_tensor(t)]).sum()
torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
"""
"""A user's plain FP32 step of a model file, as a process of its own."""


def run_once(
    model: Path, variant: str, baseline: Path | None, cwd: str
) -> tuple[float, float, float]:
    """Wall seconds of the whole process, CPU seconds of it and its scan process, and the
    peak resident memory (MiB) of the largest of them (``wait4``: the process and the
    children it waited for)."""
    env = {**os.environ}
    env.pop("NAN_HUNTER_IN_PROCESS", None)
    package = baseline if variant == "base" else ROOT
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package), env.get("PYTHONPATH")]))
    if variant == "in-process":
        env["NAN_HUNTER_IN_PROCESS"] = "1"
    if variant == "fp32":
        command = [sys.executable, "-c", PLAIN_STEP, str(model), str(model.parent)]
    else:
        boot = [sys.executable, "-c", "from nan_hunter.cli import main; main()"]
        command = [*boot, "scan", str(model), "--format", "json"]
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err
        )
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode not in (0, 1):
            err.seek(0)
            tail = err.read().decode()[-500:]
            raise SystemExit(f"{variant}: scan failed ({process.returncode}): {tail}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def _spread(values: list[float]) -> str:
    """Median [min-max] of per-run ratios (each run's variants ran back to back)."""
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--model", default="examples/matrix_inverse.py")
    parser.add_argument("--baseline", type=Path, help="a checkout (nan_hunter/ and configs/)")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every process")
    parser.add_argument("--no-in-process", action="store_true",
                        help="leave out the in-process variant (large models: it halves the "
                        "time of a run)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip the untimed first round (it only warms the file cache)")
    options = parser.parse_args()
    if options.threads:
        os.environ["OMP_NUM_THREADS"] = str(options.threads)
    model = (ROOT / options.model).resolve()
    baseline = options.baseline.resolve() if options.baseline else None
    if baseline is not None and not (baseline / "nan_hunter").is_dir():
        raise SystemExit(f"--baseline: no nan_hunter package in {baseline}")
    variants = ["fp32", *([] if options.no_in_process else ["in-process"]), "child",
                *(["base"] if baseline else [])]
    times: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="nh-isolation-") as cwd:
        for variant in [] if options.no_warm_up else variants:
            run_once(model, variant, baseline, cwd)  # warm the file cache
        for i in range(options.runs):
            order = variants[i % len(variants):] + variants[: i % len(variants)]
            for variant in order:
                times[variant].append(run_once(model, variant, baseline, cwd))
            print(f"run {i + 1}: " + ", ".join(
                f"{v} {times[v][-1][0]:.2f} s (cpu {times[v][-1][1]:.2f} s, "
                f"peak {times[v][-1][2]:.0f} MiB)" for v in variants
            ), flush=True)  # fmt: skip
    for k, what, unit in ((0, "wall", "s"), (1, "cpu", "s"), (2, "peak RSS", "MiB")):
        median = {v: statistics.median(t[k] for t in times[v]) for v in variants}
        line = ", ".join(f"{v} {median[v]:.2f} {unit}" for v in variants)
        pairs = [("child", "fp32"), ("child", "base"), ("child", "in-process")]
        ratios = "; ".join(
            f"{a}/{b} {_spread([x[k] / y[k] for x, y in zip(times[a], times[b], strict=True)])}"
            for a, b in pairs if b in times
        )
        print(f"{what}: median {line}; per run {ratios}")


if __name__ == "__main__":
    main()
