"""The step verdict: is this training step a problem, and why. One function for ``watch``,
``run_steps`` and the framework callbacks."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch


class Reason(str, enum.Enum):
    """Why a step counts as a problem."""

    LOSS = "non_finite_loss"
    """The loss is NaN or inf (always a problem: loss scaling cannot fix the forward)."""
    GRADIENT = "non_finite_gradient"
    """A gradient is NaN or inf and no (enabled) GradScaler handles it."""
    SKIPPED = "skipped_steps"
    """GradScaler skipped ``skip_patience`` steps in a row after its scale had settled."""
    SCALE_COLLAPSE = "scale_collapse"
    """GradScaler's scale fell below ``scale_floor``."""
    OTHER_RANK = "problem_on_another_rank"
    """Distributed: this rank saw nothing wrong, another rank did at the same step."""
    SPIKE = "loss_spike"
    """The loss is finite but more than K times its running median (``run
    --spikes-are-problems``)."""
    FORECAST = "overflow_forecast"
    """The sampled range map forecasts an overflow before the next sample (``run
    --stop-before-overflow``): the step itself is finite."""
    PREFLIGHT = "preflight_findings"
    """A framework callback's pre-flight scan of the first batch (before step 0) found errors."""


@dataclass(frozen=True)
class Problem:
    reason: Reason
    detail: str
    """One line for a person: what was seen."""

    @property
    def own_batch(self) -> bool:
        """The step's own forward went non-finite (its batch or loss), not only the gradients
        that may have arrived from another rank through an all-reduce."""
        return self.reason is Reason.LOSS


def step_verdict(
    *,
    loss: torch.Tensor | None,
    loss_ok: bool,
    grads_ok: bool,
    scaled: bool,
    scale_problem: Problem | None,
    bad_grads: Callable[[], str],
) -> Problem | None:
    """A non-finite loss wins; else non-finite gradients when no GradScaler handles them; else
    what GradScaler's scale shows (a run of skipped steps, a collapsed scale). ``bad_grads``
    names the parameters with non-finite gradients; it is called only on a problem."""
    if not loss_ok:
        value = float(loss.detach().float()) if loss is not None else float("nan")
        return Problem(Reason.LOSS, f"the loss is {value:g}")
    if not grads_ok and not scaled:
        return Problem(Reason.GRADIENT, "non-finite gradient" + bad_grads())
    return scale_problem
