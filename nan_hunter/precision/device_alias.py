"""Let the user's own ``torch.autocast("cuda", ...)`` regions act on the CPU during an emulation.

When nan-hunter predicts a CUDA run on a CPU, the model's code still says ``device_type="cuda"``:
``torch.autocast("cuda", enabled=False)`` around an FP32 region, ``torch.amp.custom_fwd(
device_type="cuda", cast_inputs=torch.float32)`` on a custom Function, and so do nan-hunter's own
patches. Without a GPU those are silently disabled. ``DeviceAlias`` maps the device type
``"cuda"`` to ``"cpu"`` in ``torch.autocast``, ``torch.is_autocast_enabled``,
``torch.get_autocast_dtype`` and the input cast of ``custom_fwd``, for the duration of a ``with``
block, and puts the originals back on exit.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
import torch.amp.autocast_mode as autocast_mode


class DeviceAlias:
    def __init__(self, source: str = "cuda", target: str = "cpu") -> None:
        self._source = source
        self._target = target
        self._saved: list[tuple[Any, str, Any]] = []

    def _map(self, device_type: Any) -> Any:
        return self._target if device_type == self._source else device_type

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, make(original))

    def __enter__(self) -> DeviceAlias:
        mapped = self._map
        try:
            self._patch(
                autocast_mode.autocast,
                "__init__",
                lambda init: lambda obj, device_type, *a, **k: init(  # passes the call on
                    obj, mapped(device_type), *a, **k
                ),
            )
            for name in ("is_autocast_enabled", "get_autocast_dtype"):
                self._patch(
                    torch,
                    name,
                    lambda fn: lambda *a, **k: fn(  # passes the call on
                        *(mapped(x) for x in a), **k
                    ),
                )
            self._patch(
                autocast_mode,
                "_cast",
                lambda fn: lambda value, device_type, dtype: fn(  # passes the call on
                    value, mapped(device_type), dtype
                ),
            )
        except BaseException:
            self._restore()
            raise
        return self

    def _restore(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved = []

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._restore()
