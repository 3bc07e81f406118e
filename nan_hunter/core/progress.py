"""Progress events from library code, for whoever is listening (the CLI's progress display).

Library code calls ``announce("FP32 reference run")`` at the start of each long piece of work;
nothing happens unless a listener is installed with ``listening(callback)``. The listener is a
context variable, so a scan in another thread or a nested scan does not see it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Listener = Callable[[str], None]

_LISTENER: ContextVar[Listener | None] = ContextVar("nan_hunter_progress", default=None)


def announce(what: str) -> None:
    """Tell the listener, if any, that ``what`` is starting now."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(what)


@contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)
