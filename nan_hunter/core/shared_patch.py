"""One replacement of a function in another module, shared by everyone who needs it at once.

nan-hunter replaces a few functions of torch while it works (``torch.autocast.__init__`` and
friends for the CUDA-on-CPU emulation, ``clip_grad_norm_`` for ``watch``). Each user saving the
attribute it found and putting it back on exit breaks as soon as two overlap in anything but
strict nesting: two scans in two threads, two watchers closed in the order they opened. The
later one saves the earlier one's replacement as "the original" and puts it back last, so the
caller's process keeps a patched torch for good.

A ``SharedPatch`` counts its users instead: the first ``acquire`` installs the replacement, the
last ``release`` puts back the attribute the first one found (unless something else replaced it
since, which is then left as it is), under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class SharedPatch:
    def __init__(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """``make(original)`` builds the replacement of ``owner.name``."""
        self._owner = owner
        self._name = name
        self._make = make
        self._lock = threading.Lock()
        self._users = 0
        self._original: Any = None
        self._installed: Any = None

    @property
    def installed(self) -> bool:
        return self._users > 0

    def acquire(self) -> None:
        with self._lock:
            if self._users == 0:
                self._original = getattr(self._owner, self._name)
                self._installed = self._make(self._original)
                setattr(self._owner, self._name, self._installed)
            self._users += 1

    def release(self) -> None:
        with self._lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users == 0:
                if getattr(self._owner, self._name, None) is self._installed:
                    setattr(self._owner, self._name, self._original)
                self._original = self._installed = None
