"""Clipping scaled gradients: ``clip_grad_norm_`` called before ``scaler.unscale_(optimizer)``.

With a GradScaler the gradients after ``scaler.scale(loss).backward()`` are multiplied by the
loss scale (2**16 at the start): a ``max_norm`` meant for true gradients then clips almost
everything, and the clipping changes as the scale moves. The watcher wraps the two clipping
functions of ``torch.nn.utils`` while it is installed and asks the scaler whether the
optimizer's gradients have been unscaled yet.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

FIX = (
    "scaler.unscale_(optimizer)\n"
    "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)"
)
"""The two lines that clip true gradients: unscale first, then clip."""

_FUNCTIONS = ("clip_grad_norm_", "clip_grad_value_")


@dataclass(frozen=True)
class WatchWarning:
    """A training-loop mistake seen by the watcher (not a non-finite step)."""

    code: str
    step: int
    """The ``w.step()`` call it was seen before (0-based)."""
    message: str
    fix: str


def gradients_scaled(scaler: Any, optimizer: Any) -> bool:
    """True when ``optimizer``'s gradients still carry the loss scale: an enabled scaler whose
    state for this optimizer is not ``UNSCALED`` (nor ``STEPPED``)."""
    if scaler is None or optimizer is None or not scaler.is_enabled():
        return False
    states = getattr(scaler, "_per_optimizer_states", None)
    state = states.get(id(optimizer)) if isinstance(states, dict) else None
    stage = getattr((state or {}).get("stage"), "name", "READY")
    return stage == "READY"


class ClipGuard:
    """Wraps ``torch.nn.utils.clip_grad_norm_``/``clip_grad_value_`` (and their home module
    ``torch.nn.utils.clip_grad``) while installed; ``on_scaled(name)`` is called when one of
    them is given parameters of ``params`` whose gradients are still scaled."""

    def __init__(
        self,
        params: list[torch.Tensor],
        scaled: Callable[[], bool],
        on_scaled: Callable[[str], None],
    ) -> None:
        self._ids = {id(p) for p in params}
        self._scaled = scaled
        self._on_scaled = on_scaled
        self._patched: list[tuple[Any, str, Any, Any]] = []

    def install(self) -> None:
        from torch.nn.utils import clip_grad

        for home in (torch.nn.utils, clip_grad):
            for name in _FUNCTIONS:
                original = getattr(home, name, None)
                if original is None:
                    continue
                wrapper = self._wrap(name, original)
                setattr(home, name, wrapper)
                self._patched.append((home, name, original, wrapper))

    def remove(self) -> None:
        patched, self._patched = self._patched, []
        for home, name, original, wrapper in reversed(patched):
            if getattr(home, name, None) is wrapper:  # not replaced again since
                setattr(home, name, original)

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(parameters, torch.Tensor):
                parameters = [parameters]
            parameters = list(parameters) if isinstance(parameters, Iterable) else parameters
            if (
                isinstance(parameters, list)
                and any(id(p) in self._ids and p.grad is not None for p in parameters)
                and self._scaled()
            ):
                self._on_scaled(name)
            return original(parameters, *args, **kwargs)

        return clip
