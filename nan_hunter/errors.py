"""The one exception family for failures nan-hunter expects and explains.

Library code raises these; only the CLI turns them into a one-line message and exit code 2.
"""

from __future__ import annotations

import re

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


NOT_THE_MODELS: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit, NanHunterError)
"""What may come out of the model's code and is not its error to report: the user's Ctrl-C,
``sys.exit`` (the scan process says the model called it) and our own errors. Any other
exception, ``BaseException`` subclasses too (``asyncio.CancelledError``, ``GeneratorExit``, the
model's own), is the model's."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (torch's messages run to many lines)."""
    try:
        text = _ANSI.sub("", str(exc)).strip()
    except Exception:
        return f"{type(exc).__name__} (its message cannot be shown: its __str__ raises)"
    return text.splitlines()[0] if text else type(exc).__name__
