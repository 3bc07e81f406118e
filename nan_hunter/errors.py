"""The one exception family for failures nan-hunter expects and explains, and how nan-hunter's
own failures inside the model's call are told from the model's.

Library code raises ``NanHunterError``s; only the CLI turns them into a one-line message and exit
code 2. Our code that runs inside the model's call converts its own failures into
``InternalError`` (``ours``, or two inline ``except`` clauses on a per-op path), letting
``OURS_AS_THEY_ARE`` through; ``blame.user_errors`` calls every other exception the model's.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NanHunterError(Exception):
    """Base class: an expected failure with a message fit for a user."""


class ConfigError(NanHunterError):
    """A bad configuration file, key or value."""


class LoadError(NanHunterError):
    """The user's model file, its functions, weights or batch could not be loaded."""


class UnsupportedError(NanHunterError):
    """The model computes with something a scan cannot follow (a nested tensor)."""


class UserCodeError(NanHunterError):
    """The user's own code raised while nan-hunter ran it."""

    def __init__(self, message: str, *, user_frame: str | None = None) -> None:
        super().__init__(message)
        self.user_frame = user_frame

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} (at {self.user_frame})" if self.user_frame else base


class InternalError(RuntimeError):
    """nan-hunter's own code failed while the model's call was under way: the tracer's
    bookkeeping around an op, a hook of ours (module, tensor, autograd node), the emulation's or
    the autocast policy's work around the op it passes on, the device alias, the statistics and
    the gradient log. Raised ``from`` the original exception, which ``__cause__`` (and
    ``original``) hold.

    ``blame.user_errors`` re-raises it as it is (never "the model raised ..."); so does every
    layer of ours between the failure and the pass. A caller of ``nan_hunter.scan`` gets it as
    it is (``except nan_hunter.errors.InternalError``: a bug to report, with ``original`` for
    the details); the command line prints ``internal error: <original's type>: <its first
    line>`` (``unwrap``) and, with ``--debug``, the traceback of both.

    Not a ``NanHunterError``: that family is for failures a user can act on."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__}: {first_line(original)}")
        self.original = original
        _RAISED.note(self)


class PassSignal(RuntimeError):
    """A signal from the pass's bookkeeping to the runner, not a failure: the pass must run
    again another way (``StaleStatistics``, ``UnmeasuredGradient``). It passes through every
    layer of ours unchanged."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        _RAISED.note(self)


class _RaisedInTheModel(threading.local):
    """The ``InternalError``s and ``PassSignal``s created on this thread while the model's code
    runs (inside ``blame.user_errors``): one the model catches (``except RuntimeError``, ``except
    Exception`` around a fallback path) must not be lost, or a pass would go on over an op it
    did not trace, or with statistics it never took, and could call the model clean."""

    def __init__(self) -> None:
        self.open = 0
        self.seen: list[BaseException] = []

    def note(self, exc: BaseException) -> None:
        if self.open:
            self.seen.append(exc)

    def enter(self) -> int:
        self.open += 1
        return len(self.seen)

    def leave(self, mark: int) -> BaseException | None:
        """The first of ours created since ``mark`` (an ``InternalError`` before a signal),
        forgotten here; None when there was none."""
        self.open -= 1
        since, self.seen[mark:] = self.seen[mark:], []
        bugs = [e for e in since if isinstance(e, InternalError)]
        return (bugs or since or [None])[0]


_RAISED = _RaisedInTheModel()


def ours_raised_within() -> int:
    """Starts collecting, on this thread, our exceptions created inside the model's code; the
    mark to hand ``ours_lost_since``."""
    return _RAISED.enter()


def ours_lost_since(mark: int) -> BaseException | None:
    """Stops collecting: the first exception of ours created since ``mark`` (an ``InternalError``
    before a ``PassSignal``), or None. Called where the model's code returned, or raised an
    error of its own, it is one the model caught."""
    return _RAISED.leave(mark)


NOT_THE_MODELS: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit, NanHunterError)
"""What may come out of the model's code and is not its error to report: the user's Ctrl-C,
``sys.exit`` (the scan process says the model called it) and our own errors. Any other
exception, ``BaseException`` subclasses too (``asyncio.CancelledError``, ``GeneratorExit``, the
model's own), is the model's."""


OURS_AS_THEY_ARE: tuple[type[BaseException], ...] = (InternalError, PassSignal, *NOT_THE_MODELS)
"""What our code inside the model's call lets through unchanged: an internal error already
converted (by a layer of ours further in), a signal to the runner, and ``NOT_THE_MODELS``."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def ours(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Marks ``func`` as nan-hunter's own code that runs inside the model's call (a hook, a
    listener, a bookkeeping step): an exception out of it, other than ``OURS_AS_THEY_ARE``, is
    raised as an ``InternalError``. For code that runs once per op, write the two ``except``
    clauses inline instead (no extra call)."""

    @functools.wraps(func)
    def converting(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except OURS_AS_THEY_ARE:
            raise
        except Exception as exc:
            raise InternalError(exc) from exc

    converting.__nan_hunter_ours__ = True  # type: ignore[attr-defined]
    return converting


def converts(func: object) -> bool:
    """Whether ``func`` (a function or a bound method) is wrapped by ``ours``."""
    return getattr(getattr(func, "__func__", func), "__nan_hunter_ours__", False) is True


def unwrap(exc: BaseException) -> BaseException:
    """The exception an ``InternalError`` stands for (``exc`` itself for any other)."""
    while isinstance(exc, InternalError):
        exc = exc.original
    return exc


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (torch's messages run to many lines)."""
    try:
        text = _ANSI.sub("", str(exc)).strip()
    except Exception:
        return f"{type(exc).__name__} (its message cannot be shown: its __str__ raises)"
    return text.splitlines()[0] if text else type(exc).__name__
