"""What a scan costs next to a training step: ratios with spread, scaling, memory, host reads.

One process, variants interleaved round-robin (the starting one rotating), one warm-up each;
every ratio is taken per repetition round against that round's plain FP32 forward + backward, and
reported as the median with its min-max over the rounds. Optionally the scan of another checkout
(``--baseline DIR``, e.g. the main branch) runs in the same process as the variant ``base``, so
that before and after are measured side by side under the same load.

    python benchmarks/speed.py --quick                          # small models, < 1 min
    python benchmarks/speed.py --models transformer ophavy --baseline /work/main
    python benchmarks/speed.py --models depth --clock cpu       # depth 4..32, linear fit
    python benchmarks/speed.py --models batch                   # batch 1..16, linear fit
    python benchmarks/speed.py --models large --threads 1 --reps 3   # GPT-2 medium, Llama 210M
    python benchmarks/speed.py --device cuda                    # on a GPU: vs a CUDA AMP step

``--clock cpu`` (the default on a CPU) times with this process's CPU time: on a machine shared
with other work the wall time of a single-threaded run swings by 2-3x, its CPU time much less
(run it with ``--threads 1``). On CUDA the wall clock is used, with a synchronize around each call.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import BUILDERS, _encoder
from overhead import _linear_fit, _peak_mib, _reset_peak_rss, forward_backward

DEPTHS = (4, 8, 16, 32)
BATCHES = (1, 2, 4, 8, 16)
READ_BACKS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")
LARGE = ("gpt2-medium", "llama-200m")
"""Real-size language models from transformers configs (random weights, their own LM loss)."""
TARGETS = {"transformer": 1.3, "ophavy": 3.0, "gpt2-medium": 1.3, "llama-200m": 1.3}
"""The issues' targets: scan time / plain FP32 forward + backward."""
MEMORY_TARGETS = {"transformer": 1.3, "gpt2-medium": 1.3, "llama-200m": 1.3}
"""... and the scan's peak memory / that of the plain FP32 forward + backward."""


def build(name: str, quick: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    """``BUILDERS`` plus ``depthN`` and ``batchN`` (the depth models' transformer, batch N)."""
    if name.startswith("batch"):
        n = int(name.removeprefix("batch"))
        if quick:
            return _encoder(seed=3, layers=1, d_model=64, heads=4, ffn=256, batch=n, tokens=32)
        return _encoder(seed=3, layers=4, d_model=256, heads=4, ffn=1024, batch=n, tokens=128)
    return BUILDERS[name](quick)


def expand(models: list[str]) -> list[str]:
    names: list[str] = []
    for m in models:
        if m == "depth":
            names += [f"depth{d}" for d in DEPTHS]
        elif m == "batch":
            names += [f"batch{b}" for b in BATCHES]
        elif m == "large":
            names += LARGE
        else:
            names.append(m)
    return names


# --------------------------------------------------------------------------- the baseline


def load_baseline(checkout: Path) -> Any:
    """``scan`` of the nan_hunter package in ``checkout``, imported beside this one: its files
    are copied under the package name ``nan_hunter_base`` (imports rewritten)."""
    source = checkout / "nan_hunter"
    if not source.is_dir():
        raise SystemExit(f"--baseline: no nan_hunter package in {checkout}")
    root = Path(tempfile.mkdtemp(prefix="nh_baseline_"))
    target = root / "nan_hunter_base"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(source, target, symlinks=True, ignore=ignore)
    if (checkout / "configs").is_dir():  # the data files, beside the package in a checkout
        shutil.copytree(checkout / "configs", root / "configs", ignore=ignore)
    for path in target.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        path.write_text(re.sub(r"\bnan_hunter\b", "nan_hunter_base", text), encoding="utf-8")
    sys.path.insert(0, str(root))
    return importlib.import_module("nan_hunter_base.api").scan


# --------------------------------------------------------------------------- variants


def variants(device: str, baseline: Any | None) -> dict[str, Callable[..., Any]]:
    from nan_hunter.api import scan

    def plain(model: torch.nn.Module, batch: torch.Tensor) -> None:
        forward_backward(model, batch)

    def amp(model: torch.nn.Module, batch: torch.Tensor) -> None:
        # A CUDA AMP step as users run it: autocast forward, scaled backward.
        params = [p for p in model.parameters() if p.requires_grad]
        with torch.autocast(device, dtype=torch.float16):
            out = model(batch)
            loss = out.float().mean()
        torch.autograd.grad(loss * 65536.0, params, allow_unused=True)

    def scan_new(model: torch.nn.Module, batch: torch.Tensor) -> Any:
        return scan(model, batch, device=device)

    found: dict[str, Callable[..., Any]] = {"fp32": plain}
    if device == "cuda":
        found["amp"] = amp
    found["scan"] = scan_new
    if baseline is not None:
        found["base"] = lambda model, batch: baseline(model, batch, device=device)
    return found


@contextlib.contextmanager
def counting_read_backs(seen: list[str]) -> Iterator[None]:
    originals = {name: getattr(torch.Tensor, name) for name in READ_BACKS}

    def wrap(name: str, original: Any) -> Any:
        def counted(self: torch.Tensor, *args: Any) -> Any:
            seen.append(name)
            return original(self, *args)

        return counted

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, wrap(name, original))
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


# --------------------------------------------------------------------------- measuring


def _clock(kind: str, device: str) -> Callable[[], float]:
    if kind == "cpu":
        return time.process_time
    if device == "cuda":
        def synced() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

        return synced
    return time.perf_counter


def time_model(
    name: str, calls: dict[str, Callable[..., Any]], reps: int, clock: Callable[[], float],
    device: str, quick: bool,
) -> dict[str, Any]:
    model, batch = build(name, quick)
    model, batch = model.to(device), batch.to(device)
    result: dict[str, Any] = {"model": name, "times": {k: [] for k in calls}}
    info = None
    for key, call in calls.items():  # warm-up
        out = call(model, batch)
        if key == "scan":
            info = out
    order = list(calls)
    for rep in range(reps):
        start = rep % len(order)
        for key in order[start:] + order[:start]:
            gc.collect()
            t0 = clock()
            calls[key](model, batch)
            result["times"][key].append(clock() - t0)
    seen: list[str] = []
    with counting_read_backs(seen):
        calls["scan"](model, batch)
    result["host_reads"] = len(seen)
    if info is not None:
        result["ops"], result["status"] = info.ops, info.status
        result["codes"] = sorted({f.code for f in info.findings})
    if device == "cuda":
        result["peak_mib"] = {}
        for key, call in calls.items():
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            call(model, batch)
            torch.cuda.synchronize()
            result["peak_mib"][key] = [(torch.cuda.max_memory_allocated() - base) / 2**20]
    return result


def ratios(result: dict[str, Any], key: str, against: str = "fp32") -> list[float]:
    return [a / b for a, b in zip(result["times"][key], result["times"][against], strict=True)]


def memory_child(name: str, variant: str, quick: bool, baseline: str | None) -> None:
    """In a fresh process: RSS high-water mark of one call, over the model already built."""
    scan_base = load_baseline(Path(baseline)) if baseline else None
    calls = variants("cpu", scan_base)
    for module in ("nan_hunter.engine.scan", "nan_hunter.trace.tracer"):
        importlib.import_module(module)
    model, batch = build(name, quick)
    gc.collect()
    reset = _reset_peak_rss()
    before, source = _peak_mib()
    calls[variant](model, batch)
    after, _ = _peak_mib()
    print(json.dumps({"extra_mib": max(0.0, after - before), "source": source, "reset": reset}))


def memory(name: str, keys: list[str], args: argparse.Namespace) -> dict[str, list[float]]:
    """Peak RSS growth of one call of each variant, each in ``--memory-runs`` fresh processes,
    the variants interleaved: the high-water mark moves by tens of MiB from one process to the
    next (where the allocator happens to place the first big blocks), so one run per variant
    can swing a ratio by 0.1."""
    found: dict[str, list[float]] = {key: [] for key in keys}
    for _ in range(args.memory_runs):
        for key in keys:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--_memory-child", name, key]
            cmd += ["--quick"] if args.quick else []
            cmd += ["--threads", str(args.threads)] if args.threads else []
            cmd += ["--baseline", str(args.baseline)] if args.baseline else []
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            if lines:
                found[key].append(json.loads(lines[-1])["extra_mib"])
    return found


# --------------------------------------------------------------------------- main


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f}x [{min(values):.2f}-{max(values):.2f}]"


def report(result: dict[str, Any], device: str) -> None:
    name = result["model"]
    fp32 = statistics.median(result["times"]["fp32"])
    print(f"\n{name}: fp32 {fp32:.4f} s (median)  ops {result.get('ops')}  "
          f"status {result.get('status')} {result.get('codes') or ''}  "
          f"host reads per scan {result['host_reads']}")
    for key, times in result["times"].items():
        median = statistics.median(times)
        line = f"  {key:<5} {median:9.4f} s  x fp32 {_spread(ratios(result, key))}"
        if key == "scan" and "base" in result["times"]:
            line += f"  scan/base {_spread(ratios(result, 'scan', 'base'))}"
        if key == "scan" and "amp" in result["times"]:
            line += f"  x amp {_spread(ratios(result, 'scan', 'amp'))}"
        runs = (result.get("peak_mib") or {}).get(key)
        if runs:
            line += f"  peak +{statistics.median(runs):.1f} MiB [{min(runs):.0f}-{max(runs):.0f}]"
            base_runs = result["peak_mib"].get("fp32")
            if base_runs and statistics.median(base_runs):
                line += f" ({statistics.median(runs) / statistics.median(base_runs):.2f}x fp32)"
        print(line)
    target = TARGETS.get(name)
    if target is not None:
        measured = statistics.median(ratios(result, "scan"))
        verdict = "met" if measured <= target else "NOT met"
        print(f"  target scan <= {target}x fp32: {measured:.2f}x, {verdict}")
    peaks = result.get("peak_mib") or {}
    memory_target = MEMORY_TARGETS.get(name)
    if memory_target is not None and peaks.get("scan") and peaks.get("fp32"):
        measured = statistics.median(peaks["scan"]) / statistics.median(peaks["fp32"])
        verdict = "met" if measured <= memory_target else "NOT met"
        print(f"  target peak memory <= {memory_target}x fp32: {measured:.2f}x, {verdict}")


def scaling(results: list[dict[str, Any]], prefix: str, label: str) -> None:
    rows = [(int(r["model"].removeprefix(prefix)), r) for r in results
            if r["model"].startswith(prefix)]
    if len(rows) < 2:
        return
    xs = [x for x, _ in rows]
    print(f"\n{label} scaling ({prefix}N): {'N':>3} {'fp32 s':>9} {'scan s':>9} {'ratio':>6}")
    for x, r in rows:
        f, s = statistics.median(r["times"]["fp32"]), statistics.median(r["times"]["scan"])
        print(f"  {x:>5} {f:9.4f} {s:9.4f} {s / f:6.2f}")
    for key in ("fp32", "scan"):
        ys = [statistics.median(r["times"][key]) for _, r in rows]
        slope, intercept, r2 = _linear_fit(xs, ys)
        print(f"  {key}: t = {intercept:.4f} + {slope:.5f} x N  (R^2 {r2:.4f})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--models", nargs="+", default=["transformer", "ophavy"],
                        help="transformer, transformer-nh402, ophavy, gpt2-medium, llama-200m, "
                        "large (both), depth (4..32), batch (1..16), or single depthN/batchN "
                        "(default: transformer ophavy)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (default 5)")
    parser.add_argument("--quick", action="store_true", help="small models, 2 reps")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--clock", choices=("cpu", "wall"), default=None,
                        help="cpu: process CPU time (default on cpu); wall: wall clock "
                        "(always on cuda)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="also time the scan of the nan_hunter package in DIR, as 'base'")
    parser.add_argument("--memory", action="store_true",
                        help="peak RSS of each variant in a fresh process (CPU)")
    parser.add_argument("--memory-runs", type=int, default=5, metavar="N",
                        help="fresh processes per variant for --memory; the median is "
                        "reported (default 5)")
    parser.add_argument("--json", type=Path, default=None, help="write all measurements here")
    parser.add_argument("--_memory-child", nargs=2, dest="memory_child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick and args.reps == 5:
        args.reps = 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        base = str(args.baseline) if args.baseline else None
        memory_child(args.memory_child[0], args.memory_child[1], args.quick, base)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available here; nothing measured (skipped)")
        return 0
    clock_kind = args.clock or ("wall" if args.device == "cuda" else "cpu")
    if args.device == "cuda":
        clock_kind = "wall"
    baseline = load_baseline(args.baseline) if args.baseline else None
    calls = variants(args.device, baseline)
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, "
          f"clock {clock_kind}, reps {args.reps}, variants {', '.join(calls)}")
    results = []
    for name in expand(args.models):
        result = time_model(name, calls, args.reps, _clock(clock_kind, args.device),
                            args.device, args.quick)
        if args.memory and args.device == "cpu":
            result["peak_mib"] = memory(name, list(calls), args)
        report(result, args.device)
        results.append(result)
    scaling(results, "depth", "depth")
    scaling(results, "batch", "batch")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
