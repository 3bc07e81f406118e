"""The range map: how close each module's values came to the low-precision format's limits.

    module       forward max |x|   headroom   below normal   backward max |g|   headroom
    fc1          2.578             2.5e+04x   0%             4216               15.5x

Pure data, free of torch (the command line's own process renders it); built from the
statistics the trace already took (``nan_hunter.engine.range_map``). Headroom is the format's
largest value over the largest finite |x| (65504 / max for FP16): 8 means the values may grow 8x
before they overflow. The bottom is measured as the share of nonzero values below the format's
smallest normal (6.1e-5 for FP16), the values that lose precision or flush to 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from nan_hunter.core.location import SourceLocation

CLOSEST = 5
"""Ops listed nearest each limit (``RangeMap.top`` and ``RangeMap.bottom``)."""


@dataclass(frozen=True)
class Extent:
    """The values one side (forward outputs, or gradients reaching it in the backward) of an
    op or a module reached."""

    abs_max: float | None
    """Largest finite |x| (None: no finite floating value)."""
    values: int = 0
    """Floating values measured (finite ones)."""
    tiny: int = 0
    """Nonzero finite values below the format's smallest normal."""
    nonfinite: int = 0
    """NaN and inf values (made here, or carried from upstream)."""
    overflowed: bool = False
    """An op here made NaN/inf from finite inputs: no headroom left."""

    def headroom(self, limit: float) -> float | None:
        """``limit / abs_max``: how far the values may grow before they overflow; 0 when an op
        here overflowed; None when nothing finite was measured; inf for all zeros."""
        if self.overflowed:
            return 0.0
        if self.abs_max is None:
            return None
        return limit / self.abs_max if self.abs_max > 0 else float("inf")

    @property
    def tiny_share(self) -> float:
        """Share of the measured values below the smallest normal."""
        return self.tiny / self.values if self.values else 0.0

    def merged(self, other: Extent) -> Extent:
        highs = [x for x in (self.abs_max, other.abs_max) if x is not None]
        return Extent(
            abs_max=max(highs) if highs else None,
            values=self.values + other.values,
            tiny=self.tiny + other.tiny,
            nonfinite=self.nonfinite + other.nonfinite,
            overflowed=self.overflowed or other.overflowed,
        )


@dataclass(frozen=True)
class ModuleRange:
    """One module's row of the map: its own ops (not its children's), forward and backward."""

    module: str
    """The module path (``encoder.layers.3.attn``); ``""`` is the root, ``"(loss)"`` the loss
    function."""
    forward: Extent
    backward: Extent | None = None
    """None when no low-precision gradient reached the module (no backward, or FP32 only)."""
    ops: int = 0
    first_op: int = 0
    """Index of its first forward op: rows are in execution order."""


@dataclass(frozen=True)
class OpRange:
    """One op near a limit: the ``closest`` lists."""

    op: str
    module: str
    phase: str
    """``forward`` (its outputs) or ``backward`` (the gradients reaching it)."""
    location: SourceLocation | None
    extent: Extent
    op_index: int = 0


@dataclass(frozen=True)
class RangeMap:
    format: str
    """The low-precision format (``float16``)."""
    limit: float
    """Its largest finite value (65504)."""
    smallest_normal: float
    """Its smallest normal value (6.1e-5)."""
    loss_scale: float
    """The loss scale the backward's gradients were measured at."""
    modules: tuple[ModuleRange, ...]
    top: tuple[OpRange, ...] = ()
    """The ops with the least headroom, fewest first (up to ``CLOSEST``)."""
    bottom: tuple[OpRange, ...] = ()
    """The ops with the largest share of values below the smallest normal (only ops with
    some; up to ``CLOSEST``)."""

    def headroom(self, extent: Extent) -> float | None:
        return extent.headroom(self.limit)


def module_label(module: str) -> str:
    """How a module path is shown: the root as ``(root)``."""
    return module or "(root)"
