"""Leaves of nested call arguments, fast: tuples, lists and dicts only (what ops take).

``torch.utils._pytree`` handles any registered container but costs ~10 µs per call; these run on
every traced op. Other objects are leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

_CONTAINERS = (tuple, list, dict)


def leaves(obj: Any) -> Iterator[Any]:
    # A leaf is yielded here rather than by a nested generator of its own: most items are.
    if isinstance(obj, (tuple, list)):
        for item in obj:
            if isinstance(item, _CONTAINERS):
                yield from leaves(item)
            else:
                yield item
    elif isinstance(obj, dict):
        for item in obj.values():
            if isinstance(item, _CONTAINERS):
                yield from leaves(item)
            else:
                yield item
    else:
        yield obj


def call_leaves(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[Any]:
    """``list(leaves((args, kwargs)))``, faster for the usual flat call."""
    flat: list[Any] = []
    for x in args:
        if isinstance(x, _CONTAINERS):
            flat.extend(leaves(x))
        else:
            flat.append(x)
    if kwargs:
        for x in kwargs.values():
            if isinstance(x, _CONTAINERS):
                flat.extend(leaves(x))
            else:
                flat.append(x)
    return flat


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
            if hasattr(obj, f.name):  # a ``field(init=False)`` never set has no value
                yield from output_leaves(getattr(obj, f.name))
    else:
        yield obj


def map_leaves(fn: Callable[[Any], Any], obj: Any) -> Any:
    if isinstance(obj, list):
        return [map_leaves(fn, x) if isinstance(x, _CONTAINERS) else fn(x) for x in obj]
    if isinstance(obj, tuple):
        mapped = [map_leaves(fn, x) if isinstance(x, _CONTAINERS) else fn(x) for x in obj]
        if type(obj) is tuple:
            return tuple(mapped)
        if hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*mapped)
        return type(obj)(mapped)
    if isinstance(obj, dict):
        return {
            key: map_leaves(fn, x) if isinstance(x, _CONTAINERS) else fn(x)
            for key, x in obj.items()
        }
    return fn(obj)
