"""Let the user's own ``torch.autocast("cuda", ...)`` regions act on the CPU during an emulation.

When nan-hunter predicts a CUDA run on a CPU, the model's code still says ``device_type="cuda"``:
``torch.autocast("cuda", enabled=False)`` around an FP32 region, ``torch.amp.custom_fwd(
device_type="cuda", cast_inputs=torch.float32)`` on a custom Function, and so do nan-hunter's own
patches. Without a GPU those are silently disabled. ``DeviceAlias`` maps the device type
``"cuda"`` to ``"cpu"`` in ``torch.autocast``, ``torch.is_autocast_enabled``,
``torch.get_autocast_dtype`` and the input cast of ``custom_fwd`` (and, in ``__enter__`` and
``__exit__``, for autocast objects made before, such as a decorator built at import), for the
duration of a ``with`` block, and puts the originals back on exit: when the last alias open in
the process exits (``nan_hunter.core.shared_patch``), so that two scans in two threads leave torch
as they found it.
While any alias is open the mapping holds for the whole process, as any patch of torch does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
import torch.amp.autocast_mode as autocast_mode

from nan_hunter.core.shared_patch import SharedPatch
from nan_hunter.errors import ours

_PATCHES: dict[tuple[str, str], list[SharedPatch]] = {}
_PATCHES_LOCK = threading.Lock()


def _patches(source: str, target: str) -> list[SharedPatch]:
    """The replacements mapping ``source`` to ``target``, one set per pair for the process:
    every alias of that pair (nested, or in another thread) shares them (``SharedPatch``)."""
    with _PATCHES_LOCK:
        if (source, target) not in _PATCHES:
            _PATCHES[(source, target)] = _make_patches(source, target)
        return _PATCHES[(source, target)]


def _make_patches(source: str, target: str) -> list[SharedPatch]:
    """Each patch maps the device type (ours: its failure is an ``InternalError``) and passes
    the call on with it (its failure is the caller's, as it is)."""

    @ours
    def mapped(device_type: Any) -> Any:
        return target if _maps(device_type, source) else device_type

    @ours
    def all_mapped(values: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(target if _maps(x, source) else x for x in values)

    def mapping_args(fn: Callable[..., Any]) -> Callable[..., Any]:
        return lambda *a, **k: fn(*all_mapped(a), **k)

    @ours
    def on_source(obj: Any) -> bool:
        return _maps(getattr(obj, "device", None), source)

    def on_device(method: Callable[..., Any]) -> Callable[..., Any]:
        """``__enter__``/``__exit__`` of an autocast built before the alias opened (a decorator
        ``@torch.autocast("cuda", enabled=False)`` made when the model file was imported) act
        on ``target``: its device is swapped for the call only, so the object is the user's
        again afterwards."""

        def call(obj: Any, *a: Any) -> Any:
            if not on_source(obj):
                return method(obj, *a)
            obj.device = target
            try:
                return method(obj, *a)
            finally:
                obj.device = source

        return call

    return [
        SharedPatch(autocast_mode.autocast, "__enter__", on_device),
        SharedPatch(autocast_mode.autocast, "__exit__", on_device),
        SharedPatch(
            autocast_mode.autocast,
            "__init__",
            lambda init: lambda obj, device_type, *a, **k: init(
                obj, mapped(device_type), *a, **k
            ),
        ),
        SharedPatch(torch, "is_autocast_enabled", mapping_args),
        SharedPatch(torch, "get_autocast_dtype", mapping_args),
        SharedPatch(
            autocast_mode,
            "_cast",
            lambda fn: lambda value, device_type, dtype: fn(
                value, mapped(device_type), dtype
            ),
        ),
    ]


def held() -> bool:
    """Whether an alias holds autocast's methods replaced now (in this thread or another)."""
    with _PATCHES_LOCK:
        return any(patch.installed for patches in _PATCHES.values() for patch in patches)


def _maps(device_type: Any, source: str) -> bool:
    """Whether ``device_type`` is the aliased one: a ``str`` equal to ``source`` (any other value
    of the caller's is passed on untouched, and none of its code runs here)."""
    return isinstance(device_type, str) and device_type == source


class DeviceAlias:
    def __init__(self, source: str = "cuda", target: str = "cpu") -> None:
        self._patches = _patches(source, target)
        self._held: list[SharedPatch] = []

    def __enter__(self) -> DeviceAlias:
        try:
            for patch in self._patches:
                patch.acquire()
                self._held.append(patch)
        except BaseException:
            self._release()
            raise
        return self

    def _release(self) -> None:
        held, self._held = self._held, []
        for patch in reversed(held):
            patch.release()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release()
