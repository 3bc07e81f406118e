"""GradScaler's dynamic loss-scale policy, as the scan models it."""

from __future__ import annotations

import math
from collections.abc import Callable

from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.gradients import ScaleWindow
from nan_hunter.trace.stats import TensorStats


def back_off(
    scale: float, window: ScaleWindow | None, fmt: FloatFormat, loss: TensorStats | None = None
) -> tuple[float, int]:
    """GradScaler's dynamic policy on a step whose gradients overflow at ``scale``: it skips
    the step and halves the scale (``backoff_factor`` 0.5) until the gradients fit in ``fmt``.
    Returns the scale it settles at and the steps skipped on the way. The true largest gradient
    comes from the unscaled measurement in ``window`` (and a loss computed in ``fmt`` is scaled
    in ``fmt`` too); without a window, no scaling."""
    if window is None or window.max_abs == 0.0:
        return 1.0, max(0, round(math.log2(scale))) if scale > 1 else 0
    largest = window.max_abs / window.current
    if loss is not None and loss.dtype == fmt.name and loss.abs_max is not None:
        largest = max(largest, loss.abs_max)
    skipped = 0
    while scale > 1.0 and largest * scale > fmt.max:
        scale /= 2.0
        skipped += 1
    return scale, skipped


def largest_finite(overflowing: float, finite: Callable[[float], bool]) -> float:
    """GradScaler's scale below ``overflowing`` (a power of two whose step overflowed, above
    1) when its step at 1 is finite: the largest power of two at which ``finite`` holds, found
    by halving the exponent range, as overflow only grows with the scale (``log2`` of the range
    passes, not one per halving). 1 when none above it is."""
    low, high = 0, round(math.log2(overflowing))  # finite at 2**low, overflows at 2**high
    while high - low > 1:
        middle = (low + high) // 2
        if finite(2.0**middle):
            low = middle
        else:
            high = middle
    return 2.0**low
