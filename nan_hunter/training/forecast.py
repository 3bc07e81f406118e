"""Forecast the break: the range map sampled every N optimizer steps, and its trend.

A run that ends in an overflow at step 1,240 usually shows it long before: a module's largest
activation grows steadily, step after step, until it passes FP16's 65504. ``RangeSampler``
puts forward hooks on every module of the step's model for one step in ``every`` (forward max
|x| of each module's floating inputs, ``"<module> (input)"``, and outputs, the share of the
outputs' nonzero values below the format's
smallest normal, and, through a hook on each output, the backward max |g| at the loss scale the
step ran with). The values stay on the device until ``collect`` reads them all in one host sync
after the backward; the hooks are removed after the sampled forward, so the other steps run
without them (the cost: ``benchmarks/forecast.py``).

``Forecast`` keeps each module's samples and fits a line to log2(max |x|) over the step, on the
last ``WINDOW`` samples: a module whose fit grows (slope > 0, R² >= ``MIN_FIT``, at least
``MIN_SAMPLES`` samples) gets a ``RangeTrend`` with its doubling time and the step at which the
line reaches the format's largest finite value::

    head.proj doubles every ~180 steps (max |x| 1.2e+04 at step 900): at this rate it
    overflows float16 around step 1,240

Only the forward is forecast: the backward's values follow the loss scale, which a dynamic
GradScaler moves on its own (they are kept in the trend for the report).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nan_hunter.core.nest import output_leaves
from nan_hunter.findings import RangeTrend

DEFAULT_EVERY = 50
"""Optimizer steps between two samples (``run --forecast-every``)."""
WINDOW = 8
"""Samples the trend is fitted on (the last ones)."""
MIN_SAMPLES = 4
"""Samples a module needs before it is forecast."""
MIN_FIT = 0.9
"""The least R² of the log-linear fit that counts as a steady trend."""
HORIZON_FACTOR = 10
"""Without ``--max-steps``: a forecast is said when it falls within this many times the steps
run so far (a trend extrapolated further than that is not evidence)."""

_C = torch._C._VariableFunctions  # torch's own functions: a script may replace the public ones


@dataclass(frozen=True)
class ForecastRule:
    """How the run forecasts: sample every ``every`` optimizer steps (0: off); with
    ``stop_before``, a forecast overflow before the next sample is a problem step."""

    every: int = DEFAULT_EVERY
    stop_before: bool = False


@dataclass(frozen=True)
class RangeSample:
    """One sampled step: per module, forward max |x|, backward max |g| (None: no gradient
    reached its outputs) and the share of nonzero forward values below the smallest normal."""

    step: int
    forward: dict[str, float]
    backward: dict[str, float]
    tiny: dict[str, float]


class RangeSampler:
    """The hooks of one sampled step (see the module docstring)."""

    def __init__(self, tiny: float) -> None:
        self._tiny = tiny
        self._handles: list[RemovableHandle] = []
        self._values: list[tuple[str, str, torch.Tensor]] = []

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    @property
    def pending(self) -> bool:
        """Values wait to be collected."""
        return bool(self._values)

    def attach(self, model: torch.nn.Module) -> None:
        """Hooks on every module of ``model`` until ``detach``; their values until
        ``collect``."""
        self.detach()
        self._values = []
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_hook(self._hook(name or "(root)")))

    def detach(self) -> None:
        """Remove the forward hooks (the gradient hooks on the outputs stay with the graph)."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def _hook(self, name: str) -> Callable[[torch.nn.Module, Any, Any], None]:
        taken = f"{name} (input)"

        def record(module: torch.nn.Module, args: Any, output: Any) -> None:
            # what the module takes: a value its parent computed between two modules (``h *
            # gain``) is seen nowhere else
            for leaf in output_leaves(args):
                if _floating(leaf):
                    with torch.no_grad():
                        self._values.append((taken, "forward", _C.amax(_C.abs(leaf.detach()))))
            for leaf in output_leaves(output):
                if not _floating(leaf):
                    continue
                with torch.no_grad():
                    magnitude = _C.abs(leaf.detach())
                    self._values.append((name, "forward", _C.amax(magnitude)))
                    if leaf.dtype in (torch.float16, torch.bfloat16):
                        nonzero = magnitude > 0
                        self._values.append((name, "nonzero", nonzero.sum()))
                        tiny = nonzero & (magnitude < self._tiny)
                        self._values.append((name, "tiny", tiny.sum()))
                if leaf.requires_grad:
                    leaf.register_hook(self._grad_hook(name))

        return record

    def _grad_hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def record(grad: torch.Tensor) -> None:
            if grad.numel():
                with torch.no_grad():
                    self._values.append((name, "backward", _C.amax(_C.abs(grad.detach()))))

        return record

    def collect(self, step: int) -> RangeSample | None:
        """The values of the sampled step, read in one host sync; None when there are none."""
        values, self._values = self._values, []
        self.detach()
        if not values:
            return None
        device = values[0][2].device
        read = torch.stack([v.to(device, torch.float32).reshape(()) for _, _, v in values])
        numbers = read.tolist()
        forward: dict[str, float] = {}
        backward: dict[str, float] = {}
        nonzero: dict[str, float] = {}
        tiny: dict[str, float] = {}
        for (name, kind, _), number in zip(values, numbers, strict=True):
            into = {"forward": forward, "backward": backward, "nonzero": nonzero,
                    "tiny": tiny}[kind]
            if kind in ("forward", "backward"):
                into[name] = max(into.get(name, 0.0), number)
            else:
                into[name] = into.get(name, 0.0) + number
        shares = {name: tiny[name] / nonzero[name] for name in tiny if nonzero.get(name)}
        return RangeSample(step, forward, backward, shares)


def _floating(leaf: Any) -> bool:
    return isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel() > 0


class Forecast:
    """Each module's samples and its trend (see the module docstring)."""

    def __init__(self, limit: float, fmt: str) -> None:
        self.limit = limit
        self.fmt = fmt
        self.samples = 0
        self._series: dict[str, list[tuple[int, float]]] = {}
        self._grads: dict[tuple[str, int], float] = {}
        self._tiny: dict[tuple[str, int], float] = {}

    def add(self, sample: RangeSample) -> None:
        self.samples += 1
        for name, value in sample.forward.items():
            self._series.setdefault(name, []).append((sample.step, value))
        for name, value in sample.backward.items():
            self._grads[(name, sample.step)] = value
        for name, value in sample.tiny.items():
            self._tiny[(name, sample.step)] = value

    def trends(self) -> list[RangeTrend]:
        """Every module forecast to overflow, the earliest first."""
        found = [t for name in self._series if (t := self.trend(name)) is not None]
        return sorted(found, key=lambda t: (t.overflow_step or 0, t.module))

    def trend(self, module: str) -> RangeTrend | None:
        """The module's trend when its last samples grow steadily toward the limit."""
        points = [(s, v) for s, v in self._series.get(module, []) if v > 0 and math.isfinite(v)]
        points = points[-WINDOW:]
        if len(points) < MIN_SAMPLES:
            return None
        fit = _fit([s for s, _ in points], [math.log2(v) for _, v in points])
        if fit is None:
            return None
        slope, intercept, r2 = fit
        if slope <= 0 or r2 < MIN_FIT:
            return None
        last_step = points[-1][0]
        now = intercept + slope * last_step
        ahead = (math.log2(self.limit) - now) / slope
        return RangeTrend(
            module=module,
            steps=tuple(s for s, _ in points),
            abs_max=tuple(v for _, v in points),
            grad_abs_max=tuple(self._grads.get((module, s)) for s, _ in points),
            tiny_share=tuple(self._tiny.get((module, s)) for s, _ in points),
            doubling_steps=1.0 / slope,
            overflow_step=last_step + max(0, math.ceil(ahead)),
            limit=self.limit,
            fmt=self.fmt,
        )


def within(trend: RangeTrend, step: int, max_steps: int | None) -> bool:
    """The forecast overflow falls within the run: before ``max_steps`` when it is known, else
    within ``HORIZON_FACTOR`` times the steps run so far."""
    assert trend.overflow_step is not None
    if max_steps is not None:
        return trend.overflow_step <= max_steps
    return trend.overflow_step <= step * HORIZON_FACTOR


def _fit(xs: list[int], ys: list[float]) -> tuple[float, float, float] | None:
    """Least squares ``y = a * x + b``: ``(a, b, R²)``; None when x does not vary."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    syy = sum((y - my) ** 2 for y in ys)
    r2 = 1.0 if syy == 0 else (sxy * sxy) / (sxx * syy)
    return slope, intercept, r2
