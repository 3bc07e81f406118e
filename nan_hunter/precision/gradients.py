"""What FP16 does to gradients: values lost to underflow, and the loss scales that would save them.

During the emulated backward every FP16 result is computed in FP32 first and then rounded, so
the FP32 value each gradient *should* have is at hand at the moment it is rounded. ``GradientLog``
records, per rounded gradient, how many nonzero values vanished (became 0) or went subnormal, and,
over all gradients, a histogram of their binary exponents. Backpropagation is linear in the loss,
so a loss scale of ``2**k`` shifts every exponent by ``k``: the histogram tells for which scales no
gradient overflows and little underflows, the window a ``GradScaler`` should start in.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from nan_hunter.precision.formats import FloatFormat
from nan_hunter.trace.stats import SAMPLE, format_number

_EXP_OFFSET = 160  # frexp exponents of FP32 values lie in [-148, 129]
_EXP_BINS = 300


@dataclass(frozen=True)
class FlushStats:
    nonzero: int
    """Nonzero values of the gradient as computed in FP32."""
    vanished: int
    """... that became 0 in FP16."""
    subnormal: int
    """... that became subnormal in FP16 (below 6.1e-5: a few bits of precision left)."""

    @property
    def lost_share(self) -> float:
        return (self.vanished + self.subnormal) / self.nonzero if self.nonzero else 0.0

    def __add__(self, other: FlushStats) -> FlushStats:
        return FlushStats(
            self.nonzero + other.nonzero,
            self.vanished + other.vanished,
            self.subnormal + other.subnormal,
        )


@dataclass(frozen=True)
class ScaleWindow:
    """Loss scales ``2**low .. 2**high`` (exponents) that keep FP16 gradients healthy."""

    low: int | None
    """None: no parameter gradient limits the scale from below (or the window is empty)."""
    high: int | None
    """None: the window is empty."""
    current: float
    """The loss scale the scan ran with (1 without ``--grad-scale``)."""
    max_abs: float
    """The largest gradient magnitude at the current scale."""

    @property
    def empty(self) -> bool:
        return self.high is None

    @property
    def recommended(self) -> int | None:
        """Exponent of the recommended ``GradScaler(init_scale=2**k)``: the top of the window
        with one doubling of headroom, as gradients grow during training."""
        if self.high is None:
            return None
        return self.high - 1 if self.low is None else max(self.low, self.high - 1)


@dataclass(frozen=True)
class GradRecord:
    """What rounding to FP16 did to one gradient tensor."""

    flush: FlushStats
    histogram: tuple[int, ...]
    """Counts of the nonzero FP32 values per binary exponent (index - 160)."""


@dataclass(frozen=True)
class Boundary:
    """A gradient cast from FP32 down to FP16 on its way back (the backward of an FP32 op,
    such as a loss autocast runs in FP32, fed by an FP16 value): what the cast lost."""

    shape: tuple[int, ...]
    record: GradRecord


class GradientLog:
    """Filled by the FP16 emulation while a backward runs."""

    def __init__(self, fmt: FloatFormat) -> None:
        self._fmt = fmt
        self.records: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.boundaries: list[Boundary] = []
        """Gradients cast from FP32 to FP16, in backward order (the loss's input first)."""
        self._sizes: set[int] | None = None
        self.max_abs = 0.0
        """The largest finite gradient magnitude seen, before rounding."""

    def watch(self, sizes: set[int]) -> None:
        """Only gradients with as many values as a parameter can end up as a parameter's
        gradient: only they get a histogram; the rest only update the maximum."""
        self._sizes = sizes

    def record(self, exact: torch.Tensor, rounded: torch.Tensor, *, boundary: bool = False) -> None:
        """``exact``: an FP32 gradient before rounding; ``rounded``: the FP16 result.
        ``boundary``: a dtype cast (FP32 -> FP16) rather than an FP16 op's result: always
        measured, and kept in ``boundaries``."""
        exact = exact.detach()
        lo, hi = torch.aminmax(exact)
        lo_f, hi_f = float(lo), float(hi)
        if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
            exact = exact[torch.isfinite(exact)]
            if exact.numel() == 0:
                return
            lo, hi = torch.aminmax(exact)
            lo_f, hi_f = float(lo), float(hi)
        self.max_abs = max(self.max_abs, abs(lo_f), abs(hi_f))
        if self._sizes is not None and rounded.numel() not in self._sizes and not boundary:
            return
        # Shares are all the window and the underflow check need: a strided sample of large
        # gradients gives them, at a fixed cost per tensor.
        flat_exact = exact.reshape(-1)
        flat_rounded = rounded.detach().reshape(-1)
        step = max(1, flat_exact.numel() // SAMPLE)
        if step > 1:
            flat_exact, flat_rounded = flat_exact[::step], flat_rounded[::step]
        zeros = flat_exact.numel() - int(torch.count_nonzero(flat_exact))
        exponents = torch.frexp(flat_exact).exponent.to(torch.int64).add_(_EXP_OFFSET)
        counts = torch.bincount(exponents.clamp_(0, _EXP_BINS - 1), minlength=_EXP_BINS)
        counts[_EXP_OFFSET] -= zeros  # frexp(0) has exponent 0
        histogram = tuple(counts.tolist())
        nonzero = flat_exact.numel() - zeros
        limit = _EXP_OFFSET + round(math.log2(self._fmt.smallest_normal))
        below_normal = sum(histogram[: limit + 1])
        vanished = max(0, flat_rounded.numel() - int(torch.count_nonzero(flat_rounded)) - zeros)
        flush = FlushStats(nonzero, vanished, max(0, below_normal - vanished))
        if step > 1:  # counts of the whole tensor, estimated
            scale = exact.numel() / flat_exact.numel()
            flush = FlushStats(*(round(n * scale) for n in (nonzero, vanished, flush.subnormal)))
        self.records[rounded] = GradRecord(flush, histogram)
        if boundary:
            self.boundaries.append(Boundary(tuple(rounded.shape), self.records[rounded]))

    def boundary_low(self, current_scale: float, max_underflow_share: float) -> int | None:
        """The smallest exponent ``k`` at which no cast boundary loses more than
        ``max_underflow_share`` of its values; None when none loses that much at the current
        scale."""
        shift = math.log2(current_scale)
        limit = math.log2(self._fmt.smallest_normal)
        cumulative = [
            list(itertools.accumulate(b.record.histogram))
            for b in self.boundaries
            if b.record.flush.nonzero
        ]
        if not any(_lost_share(c, 0.0, limit) > max_underflow_share for c in cumulative):
            return None
        for k in range(-40, 81):
            if all(_lost_share(c, k - shift, limit) <= max_underflow_share for c in cumulative):
                return k
        return None

    def inherit(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """``target`` is a view or copy of ``source`` (a transpose, the cast back to FP32)."""
        record = self.records.get(source)
        if record is not None:
            self.records[target] = record

    def window(
        self,
        current_scale: float,
        max_underflow_share: float,
        parameters: list[GradRecord],
    ) -> ScaleWindow:
        """Scales ``2**k`` at which no gradient overflows and no parameter loses more than
        ``max_underflow_share`` of its nonzero gradient values to underflow."""
        if self.max_abs == 0.0:
            return ScaleWindow(None, None, current_scale, 0.0)
        shift = math.log2(current_scale)
        limit = math.log2(self._fmt.smallest_normal)
        true_max = self.max_abs / current_scale
        cumulative = [list(itertools.accumulate(r.histogram)) for r in parameters if r.histogram]
        ks = []
        for k in range(-40, 41):
            if true_max * 2.0**k > self._fmt.max:
                continue
            if all(
                _lost_share(c, k - shift, limit) <= max_underflow_share for c in cumulative
            ):
                ks.append(k)
        if not ks:
            return ScaleWindow(None, None, current_scale, self.max_abs)
        low = min(ks) if cumulative and min(ks) > -40 else None
        return ScaleWindow(low, max(ks), current_scale, self.max_abs)


def _lost_share(cumulative: list[int], shift: float, limit: float) -> float:
    """Share of values below ``2**limit`` once multiplied by ``2**shift``: a value with binary
    exponent e lies in [2**(e-1), 2**e), so it is lost when e + shift <= limit.
    ``cumulative`` is the running sum of an exponent histogram."""
    total = cumulative[-1]
    last = math.floor(limit - shift) + _EXP_OFFSET  # the highest lost bin
    if total == 0 or last < 0:
        return 0.0
    return cumulative[min(last, len(cumulative) - 1)] / total


def scale_advice(window: ScaleWindow, fmt: FloatFormat) -> str:
    """One sentence: the window of loss scales and the GradScaler to use, or that none fits."""
    if window.high is None or window.recommended is None:
        return (
            f"no loss scale keeps these gradients within {fmt.name}: the largest reaches "
            f"{format_number(window.max_abs / window.current)} unscaled while many are tiny; "
            "keep these layers in FP32 or train in BF16"
        )
    scales = (
        f"loss scales up to 2**{window.high} keep every gradient finite"
        if window.low is None
        else f"loss scales 2**{window.low} .. 2**{window.high} keep every gradient finite and "
        "lose little"
    )
    return f"{scales}; use torch.amp.GradScaler(init_scale=2**{window.recommended})"
