"""Per-tensor statistics as data, and their one-line human summary (in the spirit of
lovely-tensors). Free of torch, so that the command line's own process, which only renders the
report its scan process sends back, never imports it (``trace.stats`` takes them from tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
"""The floating dtypes statistics are taken of, by name."""


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
    """Zeros (None: not counted, as for FP32 results in the low-precision pass): exact up to
    ``EXACT_UP_TO`` values and wherever a verdict reads them; beyond, in the FP16 results of a
    scan's low-precision pass, estimated on the sample ``tiny`` is counted on."""
    tiny: int | None = 0
    """Finite nonzero values below the scan format's smallest normal (FP16: 6.1e-5); exact up to
    ``EXACT_UP_TO`` values, estimated beyond from a strided sample of ``SAMPLE`` values
    (``trace.stats.sample_of``; None: not counted)."""
    unwritten: bool = False
    """Memory no op wrote (``torch.empty``'s result, a buffer written in part): whatever it
    holds is not data, so no statistic was taken (it counts as finite, with no range)."""

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    @property
    def finite(self) -> bool:
        return self.nonfinite == 0

    @property
    def is_floating(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def exceeds(self, limit: float) -> bool:
        return self.abs_max is not None and self.abs_max > limit

    def render(self) -> str:
        """One glanceable line: ``tensor[2, 6] float16 x∈[-3.5e+03, 4.1e-05] +inf×3 NaN×1``."""
        shape = ", ".join(str(s) for s in self.shape)
        parts = [f"tensor[{shape}]", self.dtype]
        if self.numel == 0:
            parts.append("empty")
        elif self.unwritten:
            parts.append("uninitialised")
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
