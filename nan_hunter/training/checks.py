"""The cheap per-step checks: finite flags without host syncs, and GradScaler's scale over time."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from nan_hunter.trace.stats import finite_flag
from nan_hunter.training.step_verdict import Problem, Reason

__all__ = [
    "ScaleWatch", "bad_grad_names", "bad_optimizer_grads", "finite_flag", "grads_finite_flag",
    "params_finite", "scaler_active",
]  # fmt: skip


def grads_finite_flag(params: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """``finite_flag`` over the ``.grad`` of ``params`` (None when none has one)."""
    return finite_flag(p.grad for p in params if p.grad is not None)


def scaler_active(scaler: Any) -> bool:
    return scaler is not None and bool(scaler.is_enabled())


def bad_grad_names(model: torch.nn.Module) -> str:
    """Names of the parameters with non-finite gradients (run only on a problem)."""
    bad = [
        name
        for name, p in model.named_parameters()
        if p.grad is not None and not bool(torch.isfinite(p.grad.detach()).all())
    ]
    if not bad:
        return ""
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return f" in {bad[0]}{more}"


def bad_optimizer_grads(optimizer: torch.optim.Optimizer) -> str:
    """How many of ``optimizer``'s parameters have non-finite gradients (run only on a
    problem)."""
    bad = sum(
        1 for group in optimizer.param_groups for p in group["params"]
        if p.grad is not None and not bool(finite_flag([p.grad]))
    )  # fmt: skip
    return f" ({bad} of the optimizer's parameters)" if bad else ""


def params_finite(model: torch.nn.Module) -> bool:
    flag = finite_flag([*model.parameters(), *model.buffers()])
    return flag is None or bool(flag)


@dataclass
class ScaleWatch:
    """GradScaler's scale from step to step: skips, streaks of them, and a collapse."""

    patience: int
    floor: float
    used: float
    """The scale the coming step runs with."""
    settled: bool
    """A step has gone through since the start (or the scale had already backed off from its
    initial value): skips before that are the scaler searching down from ``init_scale``."""
    in_row: int = 0
    below_floor: bool = False
    skipped_total: int = 0

    @classmethod
    def start(cls, scaler: Any, patience: int, floor: float) -> ScaleWatch:
        scale = float(scaler.get_scale())
        initial = float(getattr(scaler, "_init_scale", scale))
        return cls(patience=patience, floor=floor, used=scale, settled=scale < initial)

    def observe(self, now: float) -> tuple[float, bool, Problem | None]:
        """The scale after ``scaler.update()``: (scale the step ran with, skipped, problem)."""
        used, self.used = self.used, now
        skipped = now < used
        if skipped:
            self.in_row += 1
            self.skipped_total += 1
        else:
            self.in_row = 0
            self.settled = True
        problem: Problem | None = None
        if now < self.floor:
            if not self.below_floor:
                problem = Problem(
                    Reason.SCALE_COLLAPSE,
                    f"the loss scale fell to {now:g}, below scale_floor {self.floor:g}: the "
                    "gradients are not finite even at a tiny scale",
                )
            self.below_floor = True
        else:
            self.below_floor = False
        if problem is None and skipped and self.settled and self.in_row == self.patience:
            problem = Problem(
                Reason.SKIPPED,
                f"GradScaler skipped {self.in_row} steps in a row (scale now {now:g}): the "
                "gradients overflow at every scale it tried",
            )
        return used, skipped, problem
