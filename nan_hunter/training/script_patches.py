"""What ``nan-hunter run`` replaces in torch while a script runs, and the ``ScriptWatch`` each
replacement reports to.

- ``torch.autograd.backward``: the tensors a backward starts from (the step's loss).
  ``Tensor.backward`` calls it by its module attribute, so this one replacement sees every
  backward once, however it was started; a backward run inside another one (reentrant
  checkpointing) is not reported.
- ``GradScaler.step``: the optimizer pre-hook runs inside it (``scaler_step`` before,
  ``scaler_step_done`` after, saying whether it returned).
- ``GradScaler.update``: the scale after it (``scaler_updated``).

Each is a ``SharedPatch``: installed by the first ``ScriptWatch.install``, put back by the last
``close``, also when watches in several threads close out of order. A replacement with no
active watch (after the script ended, in a reference a script kept) calls the original.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import torch

from nan_hunter.core.shared_patch import SharedPatch


class Reported(Protocol):
    """What a replacement reports to (``ScriptWatch``)."""

    def saw_backward(self, tensors: Any) -> None: ...
    def backward_done(self) -> None: ...
    def scaler_step(self, scaler: Any, optimizer: Any) -> None: ...
    def scaler_step_done(self, completed: bool) -> None: ...
    def scaler_updated(self, scaler: Any) -> None: ...


_active: Reported | None = None


def activate(watch: Reported) -> None:
    """``watch`` receives what the replacements see from now on."""
    global _active
    _active = watch


def deactivate(watch: Reported) -> None:
    """``watch`` receives nothing more (another active watch is left as it is)."""
    global _active
    if _active is watch:
        _active = None


def _wrap_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        active = _active
        outermost = active is not None and torch._C._current_graph_task_id() == -1
        if outermost:
            active.saw_backward(args[0] if args else kwargs.get("tensors"))
        result = original(*args, **kwargs)
        if outermost and active is not None and _active is active:
            active.backward_done()
        return result

    return backward


def _wrap_scaler_step(original: Callable[..., Any]) -> Callable[..., Any]:
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        active = _active
        if active is None or not self.is_enabled():
            return original(self, optimizer, *args, **kwargs)
        active.scaler_step(self, optimizer)
        try:
            result = original(self, optimizer, *args, **kwargs)
        except BaseException:
            active.scaler_step_done(completed=False)
            raise
        active.scaler_step_done(completed=True)
        return result

    return step


def _wrap_scaler_update(original: Callable[..., Any]) -> Callable[..., Any]:
    def update(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        active = _active
        if active is not None and self.is_enabled():
            active.scaler_updated(self)
        return result

    return update


PATCHES = (
    SharedPatch(torch.autograd, "backward", _wrap_backward),
    SharedPatch(torch.amp.GradScaler, "step", _wrap_scaler_step),
    SharedPatch(torch.amp.GradScaler, "update", _wrap_scaler_update),
)
