"""The cheap per-step checks: finite flags without host syncs, and GradScaler's scale over time."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nan_hunter.trace import torch_originals as real
from nan_hunter.trace.stats import finite_flag
from nan_hunter.training.step_verdict import Problem, Reason

__all__ = [
    "OptimizerStep", "ScaleWatch", "bad_grad_names", "bad_optimizer_grads", "finite_flag",
    "grads_finite_flag", "params_finite", "scaler_active",
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
        if p.grad is not None and not bool(real.isfinite(p.grad.detach()).all())
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


@dataclass(frozen=True)
class OptimizerStep:
    """One ``scaler.step(optimizer)`` between two ``scaler.update()`` calls: which optimizer
    (``key``, ``label`` for a person), the optimizer step's number, and whether GradScaler
    skipped it (its gradients were not finite)."""

    key: Hashable
    skipped: bool
    number: int = 0
    label: str = ""


@dataclass
class ScaleWatch:
    """GradScaler's scale from step to step: skips, streaks of them per optimizer, and a
    collapse. Several optimizers may share one GradScaler (a GAN): ``update()`` backs the scale
    off when any of them was skipped, so a streak is counted per optimizer, from the steps
    ``observe`` is given."""

    patience: int
    floor: float
    used: float
    """The scale the coming step runs with."""
    settled: bool
    """The scale had already backed off from its initial value at the start: skips are not
    the scaler searching down from ``init_scale``."""
    in_row: int = 0
    """The longest streak of skips of one optimizer now."""
    below_floor: bool = False
    skipped_total: int = 0
    streaks: dict[Hashable, int] = field(default_factory=dict)
    went_through: set[Hashable] = field(default_factory=set)
    """Optimizers with a step that was not skipped: their skips from then on are not the
    scaler's first search down from ``init_scale``."""
    tripped: OptimizerStep | None = None
    """The step whose skip made the streak that ``observe`` last reported."""

    @classmethod
    def start(cls, scaler: Any, patience: int, floor: float) -> ScaleWatch:
        scale = float(scaler.get_scale())
        initial = float(getattr(scaler, "_init_scale", scale))
        return cls(patience=patience, floor=floor, used=scale, settled=scale < initial)

    def observe(
        self, now: float, steps: Sequence[OptimizerStep] = ()
    ) -> tuple[float, bool, Problem | None]:
        """The scale after ``scaler.update()``: (scale the step ran with, a step was skipped,
        problem). ``steps``: the optimizer steps since the last update; none given, one
        optimizer, skipped when the scale backed off."""
        used, self.used = self.used, now
        outcomes = list(steps) or [OptimizerStep(None, now < used)]
        self.tripped = None
        for step in outcomes:
            if not step.skipped:
                self.streaks[step.key] = 0
                self.went_through.add(step.key)
                continue
            self.skipped_total += 1
            self.streaks[step.key] = self.streaks.get(step.key, 0) + 1
            settled = self.settled or step.key in self.went_through
            if settled and self.streaks[step.key] == self.patience and self.tripped is None:
                self.tripped = step
        self.in_row = max(self.streaks.values(), default=0)
        skipped = any(step.skipped for step in outcomes)
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
        if problem is None and self.tripped is not None:
            of = f" of {self.tripped.label}" if self.tripped.label else ""
            problem = Problem(
                Reason.SKIPPED,
                f"GradScaler skipped {self.patience} steps{of} in a row (scale now {now:g}): "
                "the gradients overflow at every scale it tried",
            )
        return used, skipped, problem
