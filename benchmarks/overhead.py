"""How much a nan-hunter scan costs next to a plain forward + backward, and next to the
other ways of looking for NaN/inf (``detect_anomaly``, transformers' DebugUnderflowOverflow).

    python benchmarks/overhead.py                 # full run (tens of minutes on 2 CPU cores)
    python benchmarks/overhead.py --quick         # smoke run, < 60 s
    python benchmarks/overhead.py --reps 7 --models transformer ophavy --json out.json

Timing: all variants of one model run in ONE process, interleaved (round-robin within each
repetition, the starting variant rotating), after one warm-up each; the median of ``--reps``
repetitions is reported. Memory: each variant of each model runs once in a fresh subprocess
(``--_memory-child MODEL VARIANT``), which reports ``ru_maxrss`` after building the model and
after the variant; the difference is the variant's peak extra memory. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from models import BUILDERS, DEPTHS, quick_layers  # noqa: E402

FULL_MODELS = ("transformer", "ophavy")
DEPTH_VARIANTS = ("fp32", "scan")
"""The depth models only feed the depth table: they run these variants unless --all-variants."""

TARGETS = {
    "transformer": 2.0,
    "ophavy": 4.0,
}
"""Target scan time as a multiple of plain FP32, per model (printed, never asserted)."""
MEMORY_TARGET = 1.3


# --------------------------------------------------------------------------- the variants


def float_loss(output: Any) -> torch.Tensor:
    """Sum of the means of all floating-point tensors in ``output`` (as nan-hunter's default)."""
    terms: list[torch.Tensor] = []
    stack = [output]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point() and obj.numel() > 0:
                terms.append(obj.float().mean())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    if not terms:
        raise ValueError("the model's output holds no floating-point tensor")
    return torch.stack(terms).sum()


def forward_backward(
    model: torch.nn.Module,
    batch: torch.Tensor,
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> None:
    """Forward and loss under ``context``, then ``torch.autograd.grad`` wrt the parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    with context():
        loss = float_loss(model(batch))
    torch.autograd.grad(loss, params, allow_unused=True)


@contextlib.contextmanager
def anomaly() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled" on every entry
        with torch.autograd.detect_anomaly():
            yield


@dataclass
class Variant:
    name: str
    label: str
    make: Callable[[torch.nn.Module, torch.Tensor], Callable[[], dict[str, Any] | None]]
    """``make(model, batch)`` does the setup and returns the call that is timed."""
    scan_options: dict[str, Any] | None = None


def _plain(
    context: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Callable[[torch.nn.Module, torch.Tensor], Callable[[], dict[str, Any] | None]]:
    def make(model: torch.nn.Module, batch: torch.Tensor) -> Callable[[], dict[str, Any] | None]:
        def call() -> None:
            forward_backward(model, batch, context)

        return call

    return make


def _scan(
    options: dict[str, Any],
) -> Callable[[torch.nn.Module, torch.Tensor], Callable[[], dict[str, Any] | None]]:
    def make(model: torch.nn.Module, batch: torch.Tensor) -> Callable[[], dict[str, Any] | None]:
        from nan_hunter.api import scan

        def call() -> dict[str, Any]:
            report = scan(model, batch, **options)
            target = report.target
            return {
                "ops": report.ops,
                "backward_nodes": report.backward_nodes,
                "findings": len(report.findings),
                "codes": sorted({f.code for f in report.findings}),
                "policy": getattr(target, "policy", None),
                "mode": getattr(target, "mode", None),
                "dtype": getattr(target, "dtype", None),
                "device": getattr(target, "device", None),
                "numerics": getattr(target, "numerics", None),
                "scan_seconds": report.seconds,
            }

        return call

    return make


def _debug_underflow_overflow(
    model: torch.nn.Module, batch: torch.Tensor
) -> Callable[[], dict[str, Any] | None]:
    import copy

    from transformers.debug_utils import DebugUnderflowOverflow

    # Its forward hooks stay on the model for good: give it a copy, so the other variants
    # interleaved with it run on a model without hooks.
    hooked = copy.deepcopy(model)
    DebugUnderflowOverflow(hooked)

    def call() -> None:
        forward_backward(hooked, batch)

    return call


def _autocast(dtype: torch.dtype) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    return lambda: torch.autocast("cpu", dtype=dtype)


def transformers_available() -> bool:
    try:
        import transformers.debug_utils  # noqa: F401
    except Exception:
        return False
    return True


@dataclass(frozen=True)
class ScanPlan:
    default_policy: str | None
    policy_choices: tuple[str, ...]
    extra: tuple[tuple[str, dict[str, Any]], ...]
    """Extra scan variants: (name, options)."""
    note: str
    defaults: str = ""
    """The default settings a plain ``scan(model, batch)`` runs with, as text."""


def scan_plan() -> ScanPlan:
    """The default scan, plus ``policy="cuda"`` when the settings offer it and it is not
    already the default (then ``policy="native"`` is run as the contrast instead)."""
    from nan_hunter.project import config

    fields = {f.name for f in dataclasses.fields(config.Settings)}
    settings = config.load_settings()
    shown = ", ".join(f"{k}={getattr(settings, k)}"
                      for k in ("dtype", "device", "mode", "policy", "numerics", "backward")
                      if k in fields)
    if "policy" not in fields:
        return ScanPlan(None, (), (), "Settings has no 'policy': no policy variant", shown)
    choices = tuple(getattr(config, "_CHOICES", {}).get("policy", ()))
    default = str(settings.policy)
    if "cuda" not in choices:
        return ScanPlan(default, choices, (),
                        f"policy choices {choices} lack 'cuda': scan policy=cuda skipped", shown)
    if default != "cuda":
        return ScanPlan(default, choices, (("scan-cuda", {"policy": "cuda"}),),
                        f"default policy is {default!r}; extra variant scan-cuda runs policy=cuda",
                        shown)
    if "native" in choices:
        return ScanPlan(default, choices, (("scan-native", {"policy": "native"}),),
                        "the default scan already uses policy=cuda; scan-native "
                        "(policy=native) runs as the contrast", shown)
    return ScanPlan(default, choices, (), "the default scan already uses policy=cuda", shown)


def all_variants(plan: ScanPlan) -> list[Variant]:
    default = plan.default_policy
    variants = [
        Variant("fp32", "plain FP32 fwd+bwd (baseline)", _plain(contextlib.nullcontext)),
        Variant("fp16", "plain autocast FP16 fwd+bwd", _plain(_autocast(torch.float16))),
        Variant("bf16", "plain autocast BF16 fwd+bwd", _plain(_autocast(torch.bfloat16))),
        Variant("scan", f"nan_hunter.scan (defaults{', policy=' + default if default else ''})",
                _scan({}), {}),
    ]
    for name, options in plan.extra:
        shown = ", ".join(f"{k}={v}" for k, v in options.items())
        variants.append(Variant(name, f"nan_hunter.scan ({shown})", _scan(options), options))
    variants.append(Variant("anomaly", "FP32 fwd+bwd under detect_anomaly()", _plain(anomaly)))
    if transformers_available():
        variants.append(Variant("debug-uo", "FP32 fwd+bwd, DebugUnderflowOverflow",
                                _debug_underflow_overflow))
    return variants


def variants_for(model: str, variants: list[Variant], every: bool) -> list[Variant]:
    if model in DEPTHS and not every:
        return [v for v in variants if v.name in DEPTH_VARIANTS]
    return variants


# --------------------------------------------------------------------------- measuring


@dataclass
class Row:
    variant: str
    label: str
    times: list[float] = field(default_factory=list)
    warmup: float = 0.0
    info: dict[str, Any] | None = None
    memory_mib: float | None = None
    memory_error: str | None = None
    error: str | None = None
    """Set when a call raised: the variant is dropped from the later repetitions."""

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None


def _busy_seconds() -> float | None:
    """CPU seconds all processes on the machine have spent busy (``/proc/stat``), or None."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _other_load(busy: tuple[float | None, float | None], own: float, wall: float) -> float | None:
    """Cores' worth of CPU that other processes (or the hypervisor, as steal) took meanwhile:
    a clean repetition shows ~0; 1.0 on a 2-core machine means half of it was busy elsewhere."""
    if busy[0] is None or busy[1] is None or wall <= 0:
        return None
    return max(0.0, (busy[1] - busy[0] - own) / wall)


def _timed(row: Row, call: Callable[[], dict[str, Any] | None]) -> float | None:
    """Time one call; on an exception record it in ``row.error`` and return None."""
    gc.collect()
    start = time.perf_counter()
    try:
        info = call()
    except Exception as exc:
        row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"  {row.variant} FAILED, dropped from the run: {row.error}", flush=True)
        return None
    seconds = time.perf_counter() - start
    if info is not None:
        row.info = info
    return seconds


def time_model(
    name: str, variants: list[Variant], reps: int, quick: bool
) -> tuple[list[Row], list[float]]:
    """The rows, and the other-load (cores) of each repetition round."""
    model, batch = BUILDERS[name](quick)
    rows = [Row(v.name, v.label) for v in variants]
    calls: list[Callable[[], dict[str, Any] | None]] = []
    for row, variant in zip(rows, variants, strict=True):
        try:
            calls.append(variant.make(model, batch))
        except Exception as exc:
            row.error = f"setup: {type(exc).__name__}: {exc}"
            calls.append(lambda: None)
    for row, call in zip(rows, calls, strict=True):
        if row.error is None:
            row.warmup = _timed(row, call) or 0.0
            print(f"  warm-up {name:<12} {row.variant:<12} {row.warmup:8.3f} s", flush=True)
    loads: list[float] = []
    for rep in range(reps):
        order = [(i + rep) % len(rows) for i in range(len(rows))]  # rotate the start
        busy, own, start = _busy_seconds(), _own_seconds(), time.perf_counter()
        for i in order:
            if rows[i].error is None:
                seconds = _timed(rows[i], calls[i])
                if seconds is not None:
                    rows[i].times.append(seconds)
        shown = "  ".join(f"{r.variant}={r.times[-1]:.3f}" for r in rows
                          if r.error is None and r.times)
        other = _other_load((busy, _busy_seconds()), _own_seconds() - own,
                            time.perf_counter() - start)
        load = ""
        if other is not None:
            loads.append(other)
            load = f"  [other load {other:.2f} cores]"
        print(f"  rep {rep + 1}/{reps} {name:<12} {shown}{load}", flush=True)
    return rows, loads


def _maxrss_mib() -> float:
    # Linux reports ru_maxrss in KiB (macOS in bytes).
    scale = 1.0 if sys.platform == "darwin" else 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def _hwm_mib() -> float | None:
    """This process's own RSS high-water mark (``VmHWM``), Linux only.

    ``ru_maxrss`` alone is not enough in a child: Linux seeds it at ``exec`` with the peak RSS
    of the process image being replaced, which after Python's vfork/exec is the PARENT's, so a
    child of a benchmark process holding 2 GiB reports >= 2 GiB whatever it does. ``VmHWM``
    belongs to the child's own address space."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def _peak_mib() -> tuple[float, str]:
    hwm = _hwm_mib()
    return (hwm, "VmHWM") if hwm is not None else (_maxrss_mib(), "ru_maxrss")


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (and so ``ru_maxrss``) to the current RSS.

    Without it the peak reached while importing torch and building the model (temporaries
    freed since) can hide a variant's whole working set. Linux >= 4.0 only."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def memory_child(model_name: str, variant_name: str, quick: bool) -> None:
    """Runs in a fresh process: build, reset the RSS high-water mark, note it, run the variant
    once, note it again."""
    import importlib

    # Module imports are not the variant's working set: import nan_hunter's lazily imported
    # modules before the baseline, as torch is.
    for module in ("nan_hunter.api", "nan_hunter.engine.scan", "nan_hunter.trace.tracer"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)

    variants = {v.name: v for v in all_variants(scan_plan())}
    model, batch = BUILDERS[model_name](quick)
    call = variants[variant_name].make(model, batch)
    gc.collect()
    maxrss_before = _maxrss_mib()
    reset = _reset_peak_rss()
    base, source = _peak_mib()
    call()
    peak, _ = _peak_mib()
    print(json.dumps({"model": model_name, "variant": variant_name, "base_mib": base,
                      "peak_mib": peak, "source": source, "hwm_reset": reset,
                      "ru_maxrss_before_mib": maxrss_before, "ru_maxrss_after_mib": _maxrss_mib()}))


def _memory_run(
    model: str, variant: str, quick: bool, threads: int | None
) -> tuple[float | None, str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_memory-child", model, variant]
    if quick:
        cmd.append("--quick")
    if threads is not None:
        cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {done.returncode}: {tail}"
    data = json.loads(lines[-1])
    extra = max(0.0, data["peak_mib"] - data["base_mib"])
    reset = "" if data["hwm_reset"] else ", high-water mark NOT reset"
    return extra, (f"{data['source']}: after build {data['base_mib']:.1f} MiB, "
                   f"peak {data['peak_mib']:.1f} MiB{reset}")


def measure_memory(model: str, rows: list[Row], quick: bool, threads: int | None) -> None:
    """One fresh subprocess per variant, two at a time (no timing runs meanwhile; each
    process's RSS is its own, so running two at once does not change what is measured).
    ``--quick`` measures ``fp32`` and ``scan`` only."""
    if quick:
        rows = [r for r in rows if r.variant in ("fp32", "scan")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(_memory_run, model, row.variant, quick, threads) for row in rows]
        for row, future in zip(rows, futures, strict=True):
            extra, detail = future.result()
            if extra is None:
                row.memory_error = detail
                print(f"  memory  {model:<12} {row.variant:<12} FAILED {detail}", flush=True)
            else:
                row.memory_mib = extra
                print(f"  memory  {model:<12} {row.variant:<12} +{extra:8.1f} MiB ({detail})",
                      flush=True)


# --------------------------------------------------------------------------- reporting


def machine_facts() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import nan_hunter

    package = Path(nan_hunter.__file__).resolve().parent
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        repo = package.parent
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "nan_hunter"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
        commit = head + (" (nan_hunter/ modified)" if dirty else "")
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu": cpu,
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "nproc": affinity or os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "nan_hunter": str(package),
        "nan_hunter_commit": commit,
    }


def _fmt(value: float | None, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if value is not None else f"{'-':>{width}}"


def print_model_table(
    model: str, rows: list[Row], params: int, loads: list[float]
) -> dict[str, Any]:
    base = next(r for r in rows if r.variant == "fp32")
    base_median = base.median or float("nan")
    print(f"\n=== {model}  ({params / 1e6:.2f}M parameters, {len(base.times)} reps, median)")
    header = (f"{'variant':<12} {'median s':>9} {'x FP32':>7} {'min s':>8} {'max s':>8} "
              f"{'1st s':>8} {'peak +MiB':>10} {'x FP32':>7}  description")
    print(header)
    print("-" * len(header))
    for row in rows:
        median = row.median
        ratio = median / base_median if median is not None else None
        mem_ratio = None
        if row.memory_mib is not None and base.memory_mib:
            mem_ratio = row.memory_mib / base.memory_mib
        low = min(row.times) if row.times else None
        high = max(row.times) if row.times else None
        print(f"{row.variant:<12} {_fmt(median, '.3f', 9)} {_fmt(ratio, '.2f', 7)} "
              f"{_fmt(low, '.3f', 8)} {_fmt(high, '.3f', 8)} {_fmt(row.warmup, '.3f', 8)} "
              f"{_fmt(row.memory_mib, '.1f', 10)} {_fmt(mem_ratio, '.2f', 7)}  {row.label}")
    for row in rows:
        if row.error:
            print(f"  {row.variant}: FAILED ({row.error}); times above are from before the "
                  "failure, if any")
        if row.info:
            i = row.info
            codes = ",".join(i["codes"]) or "-"
            target = " ".join(f"{k}={i[k]}" for k in ("policy", "mode", "dtype", "device",
                                                        "numerics") if i.get(k) is not None)
            print(f"  {row.variant}: ops={i['ops']} backward_nodes={i['backward_nodes']} "
                  f"findings={i['findings']} ({codes}) {target}")
        if row.memory_error:
            print(f"  {row.variant}: memory measurement failed: {row.memory_error}")
    if loads:
        print(f"  other load during the timed rounds: median {statistics.median(loads):.2f}, "
              f"max {max(loads):.2f} cores (0 = nothing else ran)")
        if max(loads) > 0.25:
            print("  WARNING: other processes took CPU during the timed rounds: these times "
                  "are inflated, and unevenly (multi-threaded kernels suffer most); rerun on an "
                  "idle machine")
    by_name = {r.variant: r for r in rows if r.median is not None}
    scan = by_name.get("scan")
    if scan is not None and scan.median is not None:
        fp16 = by_name.get("fp16")
        if fp16 is not None and fp16.median:
            print(f"  scan / plain autocast FP16 = {scan.median / fp16.median:.2f}x")
        target = TARGETS.get(model)
        ratio = scan.median / base_median
        if target is not None:
            verdict = "met" if ratio <= target else "NOT met"
            print(f"  target: scan <= {target:.1f}x plain FP32 -> {ratio:.2f}x ({verdict})")
        if scan.memory_mib is not None and base.memory_mib:
            mem = scan.memory_mib / base.memory_mib
            verdict = "met" if mem <= MEMORY_TARGET else "NOT met"
            print(f"  target: scan peak memory <= {MEMORY_TARGET:.1f}x plain FP32 -> "
                  f"{mem:.2f}x ({verdict})")
    return {
        "parameters": params,
        "other_load_cores_per_round": loads,
        "variants": {
            r.variant: {
                "label": r.label,
                "median_s": r.median,
                "ratio_fp32": r.median / base_median if r.median is not None else None,
                "error": r.error,
                "times_s": r.times,
                "warmup_s": r.warmup,
                "peak_extra_mib": r.memory_mib,
                "memory_ratio_fp32": (r.memory_mib / base.memory_mib
                                      if r.memory_mib is not None and base.memory_mib else None),
                "memory_error": r.memory_error,
                "scan": r.info,
            }
            for r in rows
        },
    }


def print_depth_table(results: dict[str, list[Row]], quick: bool) -> dict[str, Any] | None:
    points: list[tuple[int, float, float]] = []
    for name in DEPTHS:
        rows = {r.variant: r.median for r in results.get(name, [])}
        fp32, scan = rows.get("fp32"), rows.get("scan")
        if fp32 is not None and scan is not None:
            layers = quick_layers(name) if quick else DEPTHS[name]
            points.append((layers, fp32, scan))
    if not points:
        return None
    print("\n=== depth (time should be linear in depth)")
    header = (f"{'depth':>5} {'FP32 s':>9} {'scan s':>9} {'scan/FP32':>10} "
              f"{'scan s/layer':>13} {'FP32 s/layer':>13}")
    print(header)
    print("-" * len(header))
    for depth, fp32, scan in points:
        print(f"{depth:5d} {fp32:9.3f} {scan:9.3f} {scan / fp32:10.2f} {scan / depth:13.4f} "
              f"{fp32 / depth:13.4f}")
    out: dict[str, Any] = {"points": [
        {"depth": d, "fp32_s": f, "scan_s": s, "ratio": s / f, "scan_s_per_layer": s / d}
        for d, f, s in points
    ]}
    if len(points) >= 2:
        for label, idx in (("scan", 2), ("FP32", 1)):
            slope, intercept, r2 = _linear_fit([p[0] for p in points], [p[idx] for p in points])
            print(f"  {label}: least-squares fit t = {intercept:.4f} s + {slope:.4f} s x depth, "
                  f"R^2 = {r2:.4f}")
            out[f"{label.lower()}_fit"] = {"intercept_s": intercept, "slope_s": slope, "r2": r2}
        first, last = points[0], points[-1]
        growth = (last[2] / last[0]) / (first[2] / first[0])
        print(f"  target: scan time linear in depth -> scan s/layer at depth {last[0]} is "
              f"{growth:.2f}x that at depth {first[0]} (1.00 = perfectly linear, no fixed cost)")
        out["per_layer_growth"] = growth
    return out


def _linear_fit(xs: list[int], ys: list[float]) -> tuple[float, float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, intercept, 1.0 - ss_res / ss_tot if ss_tot else 1.0


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small models, 2 reps (< 60 s)")
    parser.add_argument("--reps", type=int, default=None,
                        help="timed repetitions per variant (default 5; 2 with --quick)")
    parser.add_argument("--models", nargs="+", choices=list(BUILDERS), default=list(BUILDERS),
                        metavar="MODEL", help=f"models to run (default all: {', '.join(BUILDERS)})")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="also write the results as JSON to FILE")
    parser.add_argument("--all-variants", action="store_true",
                        help="run every variant on the depth models too (default: "
                        f"{', '.join(DEPTH_VARIANTS)} only)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch.set_num_threads(N) here and in the memory subprocesses "
                        "(default: leave torch's own setting)")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the peak-memory subprocesses")
    parser.add_argument("--_memory-child", nargs=2, metavar=("MODEL", "VARIANT"),
                        dest="memory_child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reps is None:
        args.reps = 2 if args.quick else 5
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args.memory_child[0], args.memory_child[1], args.quick)
        return 0

    started = time.perf_counter()
    facts = machine_facts()
    plan = scan_plan()
    variants = all_variants(plan)
    print("nan-hunter overhead benchmark" + (" (--quick)" if args.quick else ""))
    for key, value in facts.items():
        print(f"  {key}: {value}")
    print(f"  reps: {args.reps} (median), one warm-up each, variants interleaved round-robin")
    print(f"  scan policy: {plan.note}")
    print(f"  scan settings (defaults): {plan.defaults}")
    if not transformers_available():
        print("  debug-uo (transformers DebugUnderflowOverflow): SKIPPED, transformers is not "
              "importable")
    if not args.all_variants:
        print(f"  depth models run only: {', '.join(DEPTH_VARIANTS)} (--all-variants for all)")
    memory_models = set(args.models)
    if args.quick and not args.no_memory:
        memory_models = {m for m in args.models if m in FULL_MODELS}
        print("  --quick: peak memory of fp32 and scan, on transformer and ophavy only")
    if args.no_memory:
        memory_models = set()

    results: dict[str, list[Row]] = {}
    params: dict[str, int] = {}
    loads: dict[str, list[float]] = {}
    for name in args.models:
        chosen = variants_for(name, variants, args.all_variants)
        model, _ = BUILDERS[name](args.quick)
        params[name] = sum(p.numel() for p in model.parameters())
        del model
        print(f"\n--- {name}: timing {', '.join(v.name for v in chosen)}", flush=True)
        results[name], loads[name] = time_model(name, chosen, args.reps, args.quick)
        if name in memory_models:
            measure_memory(name, results[name], args.quick, args.threads)

    print("\n" + "=" * 100)
    print("RESULTS  (" + ", ".join(f"{k}={v}" for k, v in facts.items()) + ")")
    out: dict[str, Any] = {"machine": facts, "reps": args.reps, "quick": args.quick,
                           "scan_policy_note": plan.note,
                           "transformers_available": transformers_available(), "models": {}}
    for name, rows in results.items():
        out["models"][name] = print_model_table(name, rows, params[name], loads[name])
    depth = print_depth_table(results, args.quick)
    if depth is not None:
        out["depth"] = depth
    total = time.perf_counter() - started
    out["total_seconds"] = total
    out["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\ntotal benchmark time: {total:.0f} s; load average at the start "
          f"{facts['loadavg']}, at the end {out['loadavg_end']} (1, 5, 15 min)")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
