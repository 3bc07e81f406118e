"""Binary-exponent histograms of FP32 values, counted on the device: what the gradient log
keeps of each gradient it measures (a sample's exponent counts, and how many of its values
rounding left nonzero), and the share of a histogram a loss scale would lose to underflow."""

from __future__ import annotations

import math

import torch

from nan_hunter.trace.stats import flat_values, sample_step

EXP_OFFSET = 160
"""Added to a binary exponent to index a histogram (``frexp`` exponents of FP32 values lie in
[-148, 129])."""
EXP_BINS = 300
"""Bins of a histogram: index ``e + EXP_OFFSET`` counts the values of binary exponent ``e``."""
BIASED = 256
"""FP32's biased exponent field takes 256 values; bucket 0 of ``_exponent_buckets`` is zero."""
ROW = BIASED + 2
"""A histogram row: the exact sample's bucket counts (``_exponent_buckets``, zeros first), then
how many of the rounded sample's values are nonzero."""
_FIRST_BIN = EXP_OFFSET - 126 - 1
"""The histogram index of bucket 0: bucket ``b`` (biased exponent ``b - 1``) holds the values
whose ``frexp`` exponent is ``b - 127``."""


def _exponent_buckets(flat_exact: torch.Tensor) -> torch.Tensor:
    """Per value, from its FP32 bits: 0 for zero, else 1 + the biased exponent field. Integer
    kernels instead of ``frexp`` (several times slower); every normal value's bucket is its
    ``frexp`` exponent + 127, and the FP32 subnormals (below 2**-126, far below anything FP16
    keeps at any loss scale) share the bucket of exponent -126."""
    if flat_exact.dtype != torch.float32:
        flat_exact = flat_exact.float()
    bits = flat_exact.view(torch.int32).bitwise_and(0x7FFFFFFF)
    return bits.bitwise_right_shift(23).add_(bits.clamp(max=1))


def exponent_histogram(bucket_counts: list[int] | list[float]) -> tuple[int, ...]:
    """The counts of buckets 1 to 256 (the nonzero values) as a histogram over binary exponents
    (index - 160)."""
    histogram = [0] * EXP_BINS
    histogram[_FIRST_BIN + 1 : _FIRST_BIN + 1 + BIASED] = map(int, bucket_counts)
    return tuple(histogram)


def exponent_counts(flat_exact: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    """The zeros among ``flat_exact`` and the counts of its nonzero values per binary
    exponent (index - 160)."""
    counts = torch.bincount(_exponent_buckets(flat_exact), minlength=BIASED + 1).tolist()
    return counts[0], exponent_histogram(counts[1:])


def fill_row(dest: torch.Tensor, exact: torch.Tensor, rounded: torch.Tensor) -> None:
    """Writes ``dest`` (a ``ROW`` row, on the device) over a strided sample of the kind
    ``_record_now`` takes: the exact values' bucket counts, then the rounded values that are
    nonzero. Both are
    flattened in memory order when they share their layout (no copy of a transposed gradient;
    the rounding keeps the layout), else in logical order."""
    if exact.stride() == rounded.stride():
        flat_exact, flat_rounded = flat_values(exact), flat_values(rounded)
    else:
        flat_exact, flat_rounded = exact.reshape(-1), rounded.reshape(-1)
    step = sample_step(flat_exact.numel())
    if step > 1:
        flat_exact, flat_rounded = flat_exact[::step], flat_rounded[::step]
    buckets = _exponent_buckets(flat_exact)
    dest[: BIASED + 1].copy_(torch.bincount(buckets, minlength=BIASED + 1))
    dest[BIASED + 1].copy_(torch.count_nonzero(flat_rounded))


def lost_share(cumulative: list[int], shift: float, limit: float) -> float:
    """Share of values below ``2**limit`` once multiplied by ``2**shift``: a value with binary
    exponent e lies in [2**(e-1), 2**e), so it is lost when e + shift <= limit.
    ``cumulative`` is the running sum of an exponent histogram."""
    total = cumulative[-1]
    last = math.floor(limit - shift) + EXP_OFFSET  # the highest lost bin
    if total == 0 or last < 0:
        return 0.0
    return cumulative[min(last, len(cumulative) - 1)] / total
