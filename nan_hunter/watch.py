"""Kept for imports written before ``nan_hunter.training``: ``from nan_hunter.watch import watch``.

``from nan_hunter import watch`` is the function. This module shares its name, so once it has
been imported ``nan_hunter.watch`` is this module; it is callable, as the function, so that
``nan_hunter.watch(model, ...)`` works either way.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from nan_hunter import training
from nan_hunter.training import *  # noqa: F403  (the same public names)

__all__ = training.__all__


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> training.Watcher:
        return training.watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
