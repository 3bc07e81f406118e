"""Which of the user's code nan-hunter is calling right now (importing the file, ``build_model()``,
``sample_batch()``), for the scan process (``nan_hunter.process.isolation``): when the user's code
ends the process (``os._exit``, a segfault, an out-of-memory kill, a hang) the CLI can say what was
running. Without a listener ``note`` does nothing. (``nan_hunter.core.progress`` announces the
scan's own passes to the progress display; the scan process listens to both.)
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
