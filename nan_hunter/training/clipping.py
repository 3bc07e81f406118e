"""Clipping scaled gradients: ``clip_grad_norm_`` called before ``scaler.unscale_(optimizer)``.

With a GradScaler the gradients after ``scaler.scale(loss).backward()`` are multiplied by the
loss scale (2**16 at the start): a ``max_norm`` meant for true gradients then clips almost
everything, and the clipping changes as the scale moves. The watcher wraps the two clipping
functions of ``torch.nn.utils`` while it is installed and asks the scaler whether the
optimizer's gradients have been unscaled yet. A script that did ``from torch.nn.utils import
clip_grad_norm_`` before the watcher started holds the original function, so the helpers those
functions call through their module (``clip_grad._clip_grads_with_norm_``, and
``_group_tensors_by_device_and_dtype`` under ``clip_grad_value_``) are wrapped as well: the
clipping is caught by what it does, whatever name it was called by. The warning names the
script's line that clipped.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from nan_hunter.core.shared_patch import SharedPatch

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
    where: str = ""
    """``file:line`` of the user's code that made the mistake ("" when not found)."""


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
    them is given parameters of ``params`` whose gradients are still scaled, with the
    ``file:line`` of the user's call.

    Every guard installed in the process shares one wrapper per function
    (``nan_hunter.core.shared_patch``), which asks each of them: watchers that overlap in any order
    or thread leave the functions as they found them when the last one is removed."""

    def __init__(
        self,
        params: list[torch.Tensor],
        scaled: Callable[[], bool],
        on_scaled: Callable[[str, str], None],
    ) -> None:
        self._params = params
        self._ids = {id(p) for p in params}
        self._scaled = scaled
        self._on_scaled = on_scaled
        self._held: list[SharedPatch] = []

    def install(self) -> None:
        with _GUARDS_LOCK:
            _GUARDS.append(self)
        for patch in _clip_patches():
            patch.acquire()
            self._held.append(patch)

    def remove(self) -> None:
        held, self._held = self._held, []
        for patch in reversed(held):
            patch.release()
        with _GUARDS_LOCK:
            if self in _GUARDS:
                _GUARDS.remove(self)

    def check(self, name: str, parameters: list[Any]) -> None:
        if any(id(p) in self._ids and p.grad is not None for p in parameters) and self._scaled():
            self._on_scaled(name, _user_line())

    def check_grads(self, name: str, grads: list[Any]) -> None:
        """As ``check``, given the gradients rather than their parameters."""
        if not grads or not self._scaled():
            return
        mine = {id(p.grad) for p in self._params if p.grad is not None}
        if any(id(g) in mine for g in grads):
            self._on_scaled(name, _user_line())


_GUARDS: list[ClipGuard] = []
_GUARDS_LOCK = threading.Lock()
_CLIP_PATCHES: list[SharedPatch] = []


def _clip_patches() -> list[SharedPatch]:
    with _GUARDS_LOCK:
        if not _CLIP_PATCHES:
            from torch.nn.utils import clip_grad

            _CLIP_PATCHES.extend(
                SharedPatch(home, name, functools.partial(_wrap, name))
                for home in (torch.nn.utils, clip_grad)
                for name in _FUNCTIONS
                if getattr(home, name, None) is not None
            )
            # what the functions call through their module: reached whatever name the script
            # imported the function by
            if getattr(clip_grad, "_clip_grads_with_norm_", None) is not None:
                _CLIP_PATCHES.append(SharedPatch(
                    clip_grad, "_clip_grads_with_norm_", _wrap_clip_with_norm
                ))
            if getattr(clip_grad, "_group_tensors_by_device_and_dtype", None) is not None:
                _CLIP_PATCHES.append(SharedPatch(
                    clip_grad, "_group_tensors_by_device_and_dtype", _wrap_grouping
                ))
        return list(_CLIP_PATCHES)


def _guards() -> list[ClipGuard]:
    with _GUARDS_LOCK:
        return list(_GUARDS)


def _wrap_clip_with_norm(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        parameters = list(parameters) if isinstance(parameters, Iterable) else parameters
        if isinstance(parameters, list) and not _checked_already():
            for guard in _guards():
                guard.check("clip_grad_norm_", parameters)
        return original(parameters, *args, **kwargs)

    return clip


def _wrap_grouping(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def group(tensorlistlist: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code.co_name
        grads = tensorlistlist if isinstance(tensorlistlist, list) else []
        if caller == "clip_grad_value_" and grads and not _checked_already():
            for guard in _guards():
                guard.check_grads("clip_grad_value_", list(tensorlistlist[0]))
        return original(tensorlistlist, *args, **kwargs)

    return group


_TORCH_HOME = os.path.dirname(torch.__file__) + os.sep
_OUR_HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_line() -> str:
    """``file:line`` of the innermost frame that is neither torch's nor nan-hunter's."""
    frame = sys._getframe(1)
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith((_TORCH_HOME, _OUR_HOME)) and not file.startswith("<"):
            return f"{file}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        parameters = list(parameters) if isinstance(parameters, Iterable) else parameters
        if isinstance(parameters, list):
            with _GUARDS_LOCK:
                guards = list(_GUARDS)
            for guard in guards:
                guard.check(name, parameters)
        _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1  # checked: the helpers need not
        try:
            return original(parameters, *args, **kwargs)
        finally:
            _INSIDE.depth -= 1

    return clip


_INSIDE = threading.local()
"""Inside a wrapped public clipping function: its helpers do not check again."""


def _checked_already() -> bool:
    return getattr(_INSIDE, "depth", 0) > 0
