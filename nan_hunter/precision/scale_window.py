"""The window of loss scales that keeps FP16 gradients healthy, and the advice it gives.

Free of torch (``GradientLog`` in ``precision.gradients`` measures it), so that the command
line's own process can render a report without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nan_hunter.trace.summary import format_number

if TYPE_CHECKING:
    from nan_hunter.precision.formats import FloatFormat


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



def scale_advice(window: ScaleWindow, fmt: FloatFormat | str) -> str:
    """One sentence: the window of loss scales and the GradScaler to use, or that none fits
    (``fmt``: the low-precision format, or its name)."""
    name = fmt if isinstance(fmt, str) else fmt.name
    if window.high is None or window.recommended is None:
        return (
            f"no loss scale keeps these gradients within {name}: the largest reaches "
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
