"""Cheap per-tensor statistics and their one-line human summary (in the spirit of lovely-tensors).

Statistics are taken over finite values only; NaN and inf are counted separately. Everything is
computed with a handful of reductions and no copy of the tensor beyond one boolean mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nan_hunter.precision.formats import FP16, FloatFormat

_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class TensorStats:
    shape: tuple[int, ...]
    dtype: str
    numel: int
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    min: float | None = None
    """Smallest finite value (None when there is none)."""
    max: float | None = None
    abs_max: float | None = None
    zeros: int | None = 0
    """Exact zeros (None: not counted, as for FP32 results in the low-precision pass)."""
    tiny: int | None = 0
    """Finite nonzero values below the scan format's smallest normal (FP16: 6.1e-5); estimated
    from a strided sample of ``SAMPLE`` values on larger tensors (None: not counted)."""

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    @property
    def finite(self) -> bool:
        return self.nonfinite == 0

    @property
    def is_floating(self) -> bool:
        return self.dtype in _DTYPE_NAMES.values()

    def exceeds(self, limit: float) -> bool:
        return self.abs_max is not None and self.abs_max > limit

    def render(self) -> str:
        """One glanceable line: ``tensor[2, 6] float16 x∈[-3.5e+03, 4.1e-05] +inf×3 NaN×1``."""
        shape = ", ".join(str(s) for s in self.shape)
        parts = [f"tensor[{shape}]", self.dtype]
        if self.numel == 0:
            parts.append("empty")
        elif self.min is not None and self.max is not None:
            parts.append(f"x∈[{format_number(self.min)}, {format_number(self.max)}]")
        elif self.is_floating:
            parts.append("no finite values")
        if self.posinf:
            parts.append(f"+inf×{self.posinf}")
        if self.neginf:
            parts.append(f"-inf×{self.neginf}")
        if self.nan:
            parts.append(f"NaN×{self.nan}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, object]:
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "numel": self.numel,
            "min": self.min,
            "max": self.max,
            "abs_max": self.abs_max,
            "nan": self.nan,
            "posinf": self.posinf,
            "neginf": self.neginf,
            "zeros": self.zeros,
            "tiny": self.tiny,
        }


def format_number(value: float) -> str:
    """Compact human form of a number: 4 significant digits, or scientific when large or small."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 9999.5:  # .4g would round 9999.7 up to its own "1e+04"
        return f"{value:.4g}"
    return f"{value:.2e}"


SAMPLE = 65536
"""``tiny`` is counted exactly up to this many values, and estimated from an evenly strided
sample of this size beyond (a share is all it feeds)."""


def tensor_stats(t: torch.Tensor, fmt: FloatFormat = FP16, *, counts: bool = True) -> TensorStats:
    """Summarise ``t``; floating tensors get full statistics, others shape and dtype only.

    One ``aminmax`` pass settles range and finiteness (NaN and inf show in the extremes); the
    NaN/inf counts are only taken when they are there. ``counts`` adds ``zeros`` and ``tiny``
    (values below ``fmt``'s smallest normal, the ones that format loses).
    """
    shape = tuple(int(s) for s in t.shape)
    numel = t.numel()
    name = dtype_name(t.dtype)
    if numel == 0 or not t.is_floating_point():
        return TensorStats(shape=shape, dtype=name, numel=numel)
    data = t.detach()
    if data.element_size() == 1:  # float8: no isfinite/aminmax kernels; FP32 holds it exactly
        data = data.float()
    lo, hi = torch.aminmax(data)
    lo_f, hi_f = float(lo), float(hi)
    nan = posinf = neginf = 0
    finite_vals = data
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
        finite_mask = torch.isfinite(data)
        n_finite = int(finite_mask.sum())
        nan = int(torch.isnan(data).sum())
        posinf = int(torch.isposinf(data).sum())
        neginf = numel - n_finite - nan - posinf
        if n_finite == 0:
            return TensorStats(shape, name, numel, nan, posinf, neginf)
        finite_vals = data[finite_mask]
        lo, hi = torch.aminmax(finite_vals)
        lo_f, hi_f = float(lo), float(hi)
    zeros = tiny = None
    if counts:
        zeros = finite_vals.numel() - int(torch.count_nonzero(finite_vals))
        tiny = _tiny(finite_vals.reshape(-1), fmt)
    return TensorStats(
        shape=shape,
        dtype=name,
        numel=numel,
        nan=nan,
        posinf=posinf,
        neginf=neginf,
        min=lo_f,
        max=hi_f,
        abs_max=max(abs(lo_f), abs(hi_f)),
        zeros=zeros,
        tiny=tiny,
    )


def _tiny(flat: torch.Tensor, fmt: FloatFormat) -> int:
    """Nonzero values below ``fmt``'s smallest normal; estimated on large tensors."""
    n = flat.numel()
    step = max(1, n // SAMPLE)
    sample = flat[::step] if step > 1 else flat
    magnitude = sample.abs()
    count = int(torch.count_nonzero((magnitude < fmt.smallest_normal) & (magnitude > 0)))
    return count if step == 1 else round(count * n / sample.numel())
