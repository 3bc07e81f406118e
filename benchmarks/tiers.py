"""Would a two-tier scan pay? The cost of a cheap first pass, next to today's one-pass scan.

A two-tier scan runs a cheap screen over the whole model and the full, traced scan only when the
screen flags something. Whatever the screen leaves out, it must still run the FP16 numerics the
user's CUDA run has (on a CPU: the emulation under the CUDA autocast policy), see every op's
output (an overflow that a later ``where``/``clamp``/``masked_fill`` hides shows nowhere else),
and measure the gradients' rounding (NH402 needs the gradient log). This script times, in one
process with the variants interleaved, each round's ratios to that round's plain FP32 step:

- ``fp32``: plain forward + loss + backward.
- ``dispatch``: the plain FP32 step under a ``TorchDispatchMode`` that only passes each op on:
  what intercepting every aten op (forward and backward) in Python costs before any check is
  made, the floor of any per-op check written in Python.
- ``intercept``: the same under a pass-through ``TorchFunctionMode`` too: the two layers a scan
  intercepts at (torch functions, for the user's line, module and call; aten ops, for the
  backward and the rounding of every op a function decomposes into), before any work.
- ``emulated``: FP16 autocast under the CUDA policy with the emulation, forward and backward, and
  nothing else: the floor of any CPU scan that is faithful to CUDA's numerics.
- ``screen``: nan-hunter's own untraced pass (what its loss-scale window passes run: the emulated
  forward with the tracer's duties but no recording, the backward with the gradient log, the
  parameter gradients' finite check), without any per-op check in the forward. The gradient log
  already takes the extremes of every gradient the backward rounds to FP16 (NaN, inf and an
  overflow show there), so the backward needs no check of its own.
- ``checked``: ``screen`` plus one queued ``aminmax`` per floating result of every torch function
  its forward calls, views excepted (no counts; read back in batches, as the tracer's queue):
  the results the full scan's tracer checks in the forward, at the layer it checks them. A
  screen that checks what the scan checks, built from nan-hunter's own parts.
- ``scan``: the full default scan.

A two-tier scan costs ``checked`` on a model the screen passes, and that plus ``scan`` on a model
it flags; it pays when the first is well below ``scan`` and most models pass. The full scan is
itself a sound screen (it makes all of those checks, and records): a screen estimate above
``scan`` would say the checks were made worse than the scan makes them, not that a screen must
cost that much. (At 9edd299, ``checked`` was ``emulated`` plus an ``aminmax`` of every aten op's
result, forward and backward, views included, and the two-tier cost ``screen + checked -
emulated``: about seven times as many tensors as the scan checks on the transformer, every
rounded gradient twice, and a "floor" above the full scan.)

    python benchmarks/tiers.py --models transformer ophavy --threads 1 --reps 7
    python benchmarks/tiers.py --quick --reps 1                 # smoke run, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import float_loss, forward_backward
from speed import build

from nan_hunter.api import scan
from nan_hunter.core.batch import Batch
from nan_hunter.engine.pass_state import fewer_collections
from nan_hunter.engine.runner import PassResult, PassRunner
from nan_hunter.precision.context import PrecisionPlan
from nan_hunter.precision.emulation import LowPrecisionEmulation
from nan_hunter.precision.formats import FP16
from nan_hunter.precision.gradients import GradientLog
from nan_hunter.project.config import Settings
from nan_hunter.trace import op_calls
from nan_hunter.trace.deferred import StatsQueue
from nan_hunter.trace.op_calls import VIEW_OPS, UntracedOps, base_name

SCALE = 2.0**16
"""GradScaler's initial scale, which the default scan uses too."""


class PassThrough(TorchDispatchMode):
    """Intercepts every aten op and only passes it on."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


class FunctionPassThrough(TorchFunctionMode):
    """Intercepts every torch function and only passes it on."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


def passthrough_step(
    model: torch.nn.Module, batch: torch.Tensor, functions: bool = False
) -> tuple[PassThrough, FunctionPassThrough | None]:
    """The plain FP32 step with every aten op (and, with ``functions``, every torch function)
    intercepted and passed on."""
    outer = FunctionPassThrough() if functions else None
    with outer or contextlib.nullcontext(), PassThrough() as mode:
        forward_backward(model, batch)
    return mode, outer


class CheckedOps(UntracedOps):
    """The untraced forward's function mode, plus a queued ``aminmax`` of every floating result
    of every torch function but a view (the results ``OpTracer`` takes statistics of)."""

    def __init__(self, before_write: Callable[[torch.Tensor], None]) -> None:
        super().__init__(before_write)
        self.queue = StatsQueue(FP16)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = super().__torch_function__(func, types, args, kwargs)
        if base_name(func) not in VIEW_OPS:
            for x in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(x, torch.Tensor) and x.is_floating_point():
                    self.queue.add(x, False)
        return out


@contextlib.contextmanager
def checked_forwards() -> Iterator[list[CheckedOps]]:
    """Within, a pass's untraced forward runs under ``CheckedOps`` (in the list yielded) instead
    of ``UntracedOps``."""
    made: list[CheckedOps] = []

    def make(before_write: Callable[[torch.Tensor], None]) -> CheckedOps:
        made.append(CheckedOps(before_write))
        return made[-1]

    original = op_calls.UntracedOps
    op_calls.UntracedOps = make  # type: ignore[assignment,misc]
    try:
        yield made
    finally:
        op_calls.UntracedOps = original  # type: ignore[misc]


def _plan() -> PrecisionPlan:
    return PrecisionPlan(mode="autocast", policy="cuda", device="cpu", fmt=FP16, emulate=True)


def emulated_step(
    model: torch.nn.Module,
    batch: torch.Tensor,
    numerics: Callable[[], contextlib.AbstractContextManager[Any]],
) -> None:
    """Forward and loss under the CUDA policy's FP16 autocast, backward at ``SCALE``, all of it
    under ``numerics``."""
    params = [p for p in model.parameters() if p.requires_grad]
    plan = _plan()
    with numerics():
        with plan.low_precision():
            loss = float_loss(model(batch))
        torch.autograd.grad(loss * SCALE, params, allow_unused=True)


def screen_pass(model: torch.nn.Module, batch: torch.Tensor) -> tuple[PassResult, GradientLog]:
    """nan-hunter's untraced pass with the gradient log, as its loss-scale window runs it."""
    plan = _plan()
    inputs = Batch(args=(batch,), kwargs={}, raw=batch)
    log = GradientLog(plan.fmt)
    with fewer_collections(), PassRunner(
        model, lambda: inputs, None, plan.fmt, plan.low_precision, plan.numerics,
        backward=True, exact_zeros=False,
    ) as runner:  # fmt: skip
        return runner.run(SCALE, log, events=False), log


def checked_pass(
    model: torch.nn.Module, batch: torch.Tensor
) -> tuple[PassResult, list[CheckedOps]]:
    """``screen_pass`` with every floating result of the forward checked, read back at the end."""
    with checked_forwards() as made:
        result, _ = screen_pass(model, batch)
    for mode in made:
        mode.queue.flush()
    return result, made


def variants() -> dict[str, Callable[[torch.nn.Module, torch.Tensor], Any]]:
    settings = Settings(device="cpu")
    return {
        "fp32": forward_backward,
        "dispatch": passthrough_step,
        "intercept": lambda m, b: passthrough_step(m, b, functions=True),
        "emulated": lambda m, b: emulated_step(m, b, lambda: LowPrecisionEmulation(torch.float16)),
        "screen": screen_pass,
        "checked": checked_pass,
        "scan": lambda m, b: scan(m, b, settings=settings),
    }


def time_variants(name: str, reps: int, quick: bool = False) -> dict[str, list[float]]:
    """Per-variant CPU times over ``reps`` interleaved rounds (the starting variant rotating),
    after one warm-up each. Every variant runs with the scan's raised collector threshold
    (``fewer_collections``), so that the variants built from nan-hunter's passes, which raise
    it, are not the only ones spared the collections."""
    model, batch = build(name, quick)
    calls = variants()
    for call in calls.values():
        call(model, batch)
    times: dict[str, list[float]] = {key: [] for key in calls}
    order = list(calls)
    for rep in range(reps):
        start = rep % len(order)
        for key in order[start:] + order[:start]:
            gc.collect()
            with fewer_collections():
                t0 = time.process_time()
                calls[key](model, batch)
                times[key].append(time.process_time() - t0)
    return times


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f}x [{min(values):.2f}-{max(values):.2f}]"


def report(name: str, times: dict[str, list[float]]) -> None:
    base = times["fp32"]
    print(f"\n{name}: fp32 {statistics.median(base):.4f} s (median)")
    for key, values in times.items():
        per_round = [v / b for v, b in zip(values, base, strict=True)]
        print(f"  {key:10s} {statistics.median(values):8.4f} s  x fp32 {_spread(per_round)}")
    screen = [c / b for c, b in zip(times["checked"], base, strict=True)]
    scan_ratio = [v / b for v, b in zip(times["scan"], base, strict=True)]
    flagged = [s + f for s, f in zip(screen, scan_ratio, strict=True)]
    print(f"  two tiers, screen passes:    {_spread(screen)}   (the checked screen)")
    print(f"  two tiers, screen flags:     {_spread(flagged)}   (that + the full scan)")
    print(f"  one tier (today):            {_spread(scan_ratio)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "ophavy"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="small models (a smoke run)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, reps {args.reps}, "
        "clock: process CPU time"
    )
    for name in args.models:
        report(name, time_variants(name, args.reps, args.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
