"""``watch``'s look at a step between its backward and its update: the optimizer's step
pre-hook.

Without a GradScaler, ``PreStepCheck.before`` (the pre-hook) reads one flag: are the gradients
about to be applied finite? When they are not, it copies the model first (the re-run then sees
the weights the step's forward used) and sets the gradients aside while ``optimizer.step()``
runs, so the update is skipped as GradScaler skips one and no NaN reaches the weights;
``after`` (the post-hook) puts them back. ``w.step`` then ``take``s what the hook saw, but
only for the very same gradients: a ``w.step`` called before the update, or a second
``optimizer.step()`` on other gradients, finds nothing and checks for itself.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from nan_hunter.training.checks import grads_finite_flag
from nan_hunter.training.model_copy import replay_copy, sharded


def _first_grad(params: list[torch.Tensor]) -> torch.Tensor | None:
    return next((p.grad for p in params if p.grad is not None), None)


@dataclass(frozen=True)
class HookSeen:
    """What the optimizer pre-hook found, tied to the gradient tensors it looked at."""

    ok: bool
    snapshot: torch.nn.Module | None
    """The model copied before the update (gradients not finite), or None."""
    grad: weakref.ref[torch.Tensor] | None
    version: int

    @classmethod
    def of(cls, params: list[torch.Tensor], ok: bool,
           snapshot: torch.nn.Module | None) -> HookSeen:
        g = _first_grad(params)
        return cls(ok, snapshot, weakref.ref(g) if g is not None else None,
                   g._version if g is not None else -1)

    def same_gradients(self, params: list[torch.Tensor]) -> bool:
        """The gradients are those the hook looked at (same tensor, unchanged version)."""
        g = _first_grad(params)
        if g is None or self.grad is None:
            return g is None and self.grad is None
        return self.grad() is g and g._version == self.version


class PreStepCheck:
    """See the module docstring: ``module`` is copied, ``params`` checked, ``optimizer``'s
    update skipped when they are not finite."""

    def __init__(
        self, module: torch.nn.Module, params: list[torch.Tensor], optimizer: Any
    ) -> None:
        self.module = module
        self.params = params
        self.optimizer = optimizer
        self._seen: HookSeen | None = None
        self._set_aside: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def before(self, *, copy: bool) -> None:
        """Check the gradients about to be applied (one host sync); when they are not finite,
        copy the model (if ``copy``: a re-run is still to be made) and skip the update."""
        flag = grads_finite_flag(self.params)
        ok = flag is None or bool(flag)
        snapshot = None
        if not ok and copy and not sharded(self.module):
            try:
                snapshot = replay_copy(self.module)
            except Exception:  # not copyable: w.step re-runs the current weights, or says why not
                snapshot = None
        self._seen = HookSeen.of(self.params, ok, snapshot)
        if not ok and self.optimizer is not None:
            # skip this update, as GradScaler skips a step: NaN must not reach the weights
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    self._set_aside.append((p, p.grad))
                    p.grad = None

    def after(self) -> None:
        """The update ran: the gradients set aside are put back."""
        aside, self._set_aside = self._set_aside, []
        for p, grad in aside:
            p.grad = grad

    def take(self) -> HookSeen | None:
        """What the hook saw of the current gradients (None: it did not see them), once."""
        seen, self._seen = self._seen, None
        if seen is not None and not seen.same_gradients(self.params):
            return None  # the hook saw another step's gradients (w.step came before the update)
        return seen

    def clear(self) -> None:
        self._seen = None
