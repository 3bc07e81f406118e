"""What nan-hunter is doing with the user's code right now, for whoever needs to know.

The scan process (``nan_hunter.isolation``) listens, so that when the user's code ends the process
(``os._exit``, a segfault, an out-of-memory kill, a hang) the CLI can say what was running. Without
a listener ``note`` does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

_listener: Callable[[str], None] | None = None


def listen(listener: Callable[[str], None] | None) -> None:
    """Send every note to ``listener`` (None: stop)."""
    global _listener
    _listener = listener


def note(what: str) -> None:
    """Say what is about to run, e.g. ``"importing model.py"`` or ``"calling build_model()"``."""
    if _listener is not None:
        _listener(what)
