"""Number formats nan-hunter reasons about, with limits taken from ``torch.finfo``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FloatFormat:
    name: str
    dtype: torch.dtype
    max: float
    smallest_normal: float
    smallest_subnormal: float

    @classmethod
    def of(cls, dtype: torch.dtype) -> FloatFormat:
        info = torch.finfo(dtype)
        return cls(
            name=str(dtype).removeprefix("torch."),
            dtype=dtype,
            max=float(info.max),
            smallest_normal=float(info.smallest_normal),
            smallest_subnormal=float(info.smallest_normal) * float(info.eps),
        )

    def rounds_to_zero(self, value: float) -> bool:
        """True when a nonzero Python scalar becomes 0 once rounded to this format."""
        if value == 0:
            return False
        return self.round(value) == 0

    @property
    def significant_bits(self) -> int:
        """Bits of significand, the implicit one included: 8 for BF16, 11 for FP16, 24 for
        FP32."""
        return round(-math.log2(self.eps)) + 1

    @property
    def eps(self) -> float:
        """The gap between 1 and the next number of the format (``torch.finfo(dtype).eps``)."""
        return self.smallest_subnormal / self.smallest_normal

    @property
    def unit_roundoff(self) -> float:
        """The largest relative error of one rounding to nearest: 2**-8 for BF16, 2**-11 for
        FP16."""
        return self.eps / 2

    @property
    def exact_integers(self) -> float:
        """Every integer up to this one is exact in the format (256 in BF16, 2048 in FP16);
        beyond it some are rounded to a neighbour."""
        return 2.0**self.significant_bits

    def round(self, value: float) -> float:
        """A Python number rounded to this format (to nearest, as a cast does)."""
        return float(torch.tensor(value, dtype=self.dtype).item())


FP16 = FloatFormat.of(torch.float16)
BF16 = FloatFormat.of(torch.bfloat16)
FP32 = FloatFormat.of(torch.float32)

LOW_PRECISION = {"float16": FP16, "bfloat16": BF16}
LOW_PRECISION_DTYPES = frozenset(f.dtype for f in LOW_PRECISION.values())
FORMATS = {**LOW_PRECISION, "float32": FP32}
"""The dtypes a scan analyses in: the low-precision ones, and FP32 for a training step that ran
in FP32 (``nan-hunter run``: its NaN is analysed as a real bug, not as an FP16 problem)."""


def format_for(name: str) -> FloatFormat:
    return FORMATS[name]
