"""Number formats nan-hunter reasons about, with limits taken from ``torch.finfo``."""

from __future__ import annotations

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
