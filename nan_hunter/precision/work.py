"""How much of a pass's work ran in FP32 rather than in the low-precision format.

    matmul/conv FLOPs  1.20e+09, in FP32 1.56e+07 (1.3%)
    elementwise values 3.40e+06, in FP32 2.10e+05 (6.2%)

Two measures, from the op events of one traced pass (no tensor is read): the FLOPs of the
matmuls, convolutions and attention calls (``nan_hunter.trace.flops``), where almost all of
the time of a mixed-precision model goes, and the values every other op writes (its
elementwise work). An op ran in FP32 when its floating result is FP32 (or FP64): under
autocast that is an op autocast's policy keeps in FP32 (a softmax, a sum) or one in an
autocast-disabled region. The model's forward counts, not the loss function.

A fix's cost is the increase of these shares over the original scan's
(``nan_hunter.fixes.cost``); the shares are kept per module too, so that fixes verified
together in one re-scan can each be given the part of the increase in their own modules.
Free of torch: the command line's process renders it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nan_hunter.trace.events import OpEvent

_FP32 = frozenset({"float32", "float64"})


@dataclass(frozen=True)
class ModuleWork:
    """The work of the ops a module ran itself (not its submodules')."""

    module: str
    matmul_flops: int
    fp32_matmul_flops: int
    elementwise: int
    fp32_elementwise: int


@dataclass(frozen=True)
class PrecisionWork:
    """A pass's matmul/conv FLOPs and elementwise values, all and in FP32, per module."""

    modules: tuple[ModuleWork, ...]

    @property
    def matmul_flops(self) -> int:
        return sum(m.matmul_flops for m in self.modules)

    @property
    def fp32_matmul_flops(self) -> int:
        return sum(m.fp32_matmul_flops for m in self.modules)

    @property
    def elementwise(self) -> int:
        return sum(m.elementwise for m in self.modules)

    @property
    def fp32_elementwise(self) -> int:
        return sum(m.fp32_elementwise for m in self.modules)

    @property
    def fp32_matmul_share(self) -> float:
        """FP32 FLOPs over all matmul/conv FLOPs (0.0 when the pass has none)."""
        return _share(self.fp32_matmul_flops, self.matmul_flops)

    @property
    def fp32_elementwise_share(self) -> float:
        return _share(self.fp32_elementwise, self.elementwise)

    def of(self, module: str) -> ModuleWork:
        """The work ``module`` ran itself (zeros when it ran no op)."""
        return next(
            (m for m in self.modules if m.module == module), ModuleWork(module, 0, 0, 0, 0)
        )


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def precision_work(events: Iterable[OpEvent]) -> PrecisionWork:
    """The work of a pass's forward ops (not the loss's), by the module that ran them."""
    sums: dict[str, list[int]] = {}
    for e in events:
        if e.in_loss:
            continue
        floating = [s for s in e.outputs if s.is_floating]
        if not floating:
            continue
        fp32 = floating[0].dtype in _FP32
        row = sums.setdefault(e.module, [0, 0, 0, 0])
        if e.flops:
            row[0] += e.flops
            row[1] += e.flops if fp32 else 0
        else:
            values = sum(s.numel for s in floating)
            row[2] += values
            row[3] += values if fp32 else 0
    return PrecisionWork(tuple(ModuleWork(module, *row) for module, row in sums.items()))
