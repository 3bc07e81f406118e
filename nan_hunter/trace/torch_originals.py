"""torch's own functions that a scan's verdicts rest on, taken when nan-hunter is imported.

A model file runs in the scan process before its model does: it can replace ``torch.isfinite``
or ``torch.autocast`` with functions that lie (a NaN that reads as finite, an autocast that does
nothing on a CPU), and every check made through those names would call a NaN clean. nan-hunter
computes its statistics and opens its autocast regions through the references taken here
instead (from torch's C functions and autocast's own module, not the public names a file may
have replaced before nan-hunter was imported); ``replaced`` names the public functions that are
no longer torch's, so that a scan of a file that replaced them is refused.

    >>> from nan_hunter.trace import torch_originals as real
    >>> bool(real.isfinite(torch.tensor(float("nan"))))
    False
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
import torch.amp.autocast_mode as _autocast_mode

_C_FUNCTIONS = torch._C._VariableFunctions
_TENSOR = torch._C.TensorBase

isfinite = _C_FUNCTIONS.isfinite
isnan = _C_FUNCTIONS.isnan
isinf = _C_FUNCTIONS.isinf
isposinf = _C_FUNCTIONS.isposinf
aminmax = _C_FUNCTIONS.aminmax
autocast = _autocast_mode.autocast
"""torch's autocast class (``torch.autocast``, ``torch.amp.autocast``)."""

FUNCTIONS = ("isfinite", "isnan", "isinf", "isposinf", "aminmax")
"""The statistics' functions: a replacement of any of them (``torch.X``, ``torch.Tensor.X``)
makes a NaN look finite."""

_TENSOR_METHODS = {name: getattr(_TENSOR, name) for name in FUNCTIONS}
_AUTOCAST_METHODS = {name: vars(autocast)[name] for name in ("__init__", "__enter__", "__exit__")}


def _autocast_names() -> list[tuple[str, ModuleType | type, str, Any]]:
    names: list[tuple[str, ModuleType | type, str, Any]] = [
        ("torch.autocast", torch, "autocast", autocast),
        ("torch.amp.autocast", torch.amp, "autocast", autocast),
        ("torch.amp.autocast_mode.autocast", _autocast_mode, "autocast", autocast),
    ]
    for device in ("cpu", "cuda"):
        amp = getattr(getattr(torch, device, None), "amp", None)
        if amp is not None and hasattr(amp, "autocast"):
            names.append((f"torch.{device}.amp.autocast", amp, "autocast", amp.autocast))
    return names


_WATCHED = (
    *((f"torch.{n}", torch, n, getattr(_C_FUNCTIONS, n)) for n in FUNCTIONS),
    *_autocast_names(),
)
"""(public name, where it lives, attribute, torch's own object)."""


def replaced(*, autocast_methods: bool = True) -> tuple[str, ...]:
    """The public names of torch's statistics and autocast functions that no longer hold
    torch's own object (a model file replaced them). ``autocast_methods``: also autocast's
    ``__init__``/``__enter__``/``__exit__`` (False while nan-hunter's own device alias holds
    them replaced)."""
    found = [name for name, owner, attribute, own in _WATCHED
             if getattr(owner, attribute, None) is not own]
    for name, own in _TENSOR_METHODS.items():
        if getattr(torch.Tensor, name, None) is not own:
            found.append(f"torch.Tensor.{name}")
    if autocast_methods:
        found += [f"torch.autocast.{name}" for name, own in _AUTOCAST_METHODS.items()
                  if vars(autocast).get(name) is not own]
    return tuple(found)
