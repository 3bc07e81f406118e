"""Updates lost in low-precision weights: ``w - lr * g`` that rounds back to ``w``.

A model trained with its parameters in FP16 or BF16 (``model.half()``, ``model.to(
torch.bfloat16)``, no FP32 master copy) loses every update smaller than half a unit in the last
place of the weight: at BF16's 8 bits a weight of 1.0 ignores any step below 2**-9 (0.002), so
training stalls with no NaN and no error. ``nan-hunter run`` looks at one optimizer step in
``--forecast-every``: before the update it copies the low-precision parameters that have a
gradient (only those: an FP32 model costs nothing; at most ``SAMPLED`` evenly spaced elements
of each), after it counts the elements whose gradient
was nonzero and whose value did not move (one host sync). When at least ``LOST_SHARE`` of them
stayed put, it says so once, with the remedies: FP32 master weights (keep the parameters FP32
and train under autocast), or an optimizer that rounds stochastically or keeps a Kahan
compensation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

LOST_SHARE = 0.5
"""The share of nonzero-gradient elements left unchanged by an update that is worth a
warning."""
SAMPLED = 1 << 16
"""Elements looked at per parameter, evenly spaced: a copy of a 7B-parameter BF16 model's
weights would double its memory at that step; this keeps it to a few MB."""

_LOW = (torch.float16, torch.bfloat16)

FIX = (
    "keep the parameters in FP32 (FP32 master weights: train under torch.autocast instead of "
    "model.half()/.to(bfloat16)), or use an optimizer with stochastic rounding or Kahan "
    "summation for low-precision weights"
)


@dataclass(frozen=True)
class LostUpdates:
    step: int
    lost: int
    """Elements whose gradient was nonzero and whose value the update left unchanged."""
    updated: int
    """Elements whose gradient was nonzero."""
    parameters: int
    """Low-precision parameters with a gradient."""
    dtype: str
    with_master: float | None = None
    """The share the same step of the same training with FP32 parameters under autocast (FP32
    master weights) left unchanged, when it was measured (``--steps``)."""

    @property
    def share(self) -> float:
        return self.lost / self.updated if self.updated else 0.0

    def line(self) -> str:
        return (
            f"the update left {100 * self.share:.3g}% of the {self.updated:,} weights with a "
            f"nonzero gradient unchanged ({self.parameters} {self.dtype} parameter"
            f"{'s' * (self.parameters != 1)}): w - lr * g rounds back to w in {self.dtype}, so "
            "training stalls without a NaN"
        ) + self._master_text()

    def _master_text(self) -> str:
        if self.with_master is None:
            return ""
        return (
            f" (with FP32 master weights, the same step of the same training under autocast "
            f"left {100 * self.with_master:.3g}% unchanged)"
        )


class UpdateSnapshot:
    """The low-precision parameters with a gradient, copied before an optimizer step."""

    def __init__(self, kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        self._kept = kept

    @classmethod
    def take(
        cls, params: Iterable[torch.Tensor], *, fp32: bool = False
    ) -> UpdateSnapshot | None:
        """None when no parameter is low precision with a gradient (nothing to watch). Up to
        ``SAMPLED`` evenly spaced elements of each are copied. ``fp32``: the FP32 parameters
        instead (what FP32 master weights do with the same updates)."""
        kept = []
        watched = (torch.float32,) if fp32 else _LOW
        with torch.no_grad():
            for p in params:
                if p.dtype in watched and p.grad is not None and p.grad.dtype == p.dtype:
                    kept.append((p, _sample(p).clone(), _sample(p.grad) != 0))
        return cls(kept) if kept else None

    def compare(self, step: int) -> LostUpdates | None:
        """What the update did to the copied parameters (one host sync); None when no element
        had a nonzero gradient."""
        with torch.no_grad():
            counts = []
            for p, before, moving in self._kept:
                still = (_sample(p) == before) & moving
                counts.append(torch.stack([still.sum(), moving.sum()]).to(torch.float64))
            device = counts[0].device
            lost, updated = (int(v) for v in torch.stack(
                [c.to(device) for c in counts]).sum(0).tolist())
        if not updated:
            return None
        dtype = str(self._kept[0][0].dtype).removeprefix("torch.")
        return LostUpdates(step, lost, updated, len(self._kept), dtype)


def _sample(t: torch.Tensor) -> torch.Tensor:
    """``SAMPLED`` evenly spaced elements of ``t`` (all of a small one), as a view where it
    can be."""
    flat = t.detach().reshape(-1)
    return flat[:: max(1, flat.numel() // SAMPLED)][:SAMPLED]
