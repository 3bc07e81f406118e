"""Leaves of nested call arguments, fast: tuples, lists and dicts only (what ops take).

``torch.utils._pytree`` handles any registered container but costs ~10 µs per call; these run on
every traced op. Other objects are leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any


def leaves(obj: Any) -> Iterator[Any]:
    if isinstance(obj, (tuple, list)):
        for item in obj:
            yield from leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from leaves(item)
    else:
        yield obj


def output_leaves(obj: Any) -> Iterator[Any]:
    """Like ``leaves``, also through dataclasses (a module may return one)."""
    if isinstance(obj, (tuple, list)):
        for item in obj:
            yield from output_leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from output_leaves(item)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from output_leaves(getattr(obj, f.name))
    else:
        yield obj


def map_leaves(fn: Callable[[Any], Any], obj: Any) -> Any:
    if isinstance(obj, list):
        return [map_leaves(fn, item) for item in obj]
    if isinstance(obj, tuple):
        mapped = [map_leaves(fn, item) for item in obj]
        if hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*mapped)
        return tuple(mapped) if type(obj) is tuple else type(obj)(mapped)
    if isinstance(obj, dict):
        return {key: map_leaves(fn, value) for key, value in obj.items()}
    return fn(obj)
