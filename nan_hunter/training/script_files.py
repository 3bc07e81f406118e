"""The files a script under ``nan-hunter run`` imported, read or wrote, as far as they matter to
``run``: its report (``-o``) and patch (``--patch``) are never written over one of them.

``scan`` knows every file it reads before it starts; a script's process learns them as it runs.
``ScriptFiles`` is installed before the script starts and answers, at the moment ``run`` is about
to write one of its targets, what the script did with that file:

- imported it: a module in ``sys.modules`` was loaded from it (``models.py`` next to the script);
- read it or wrote it: an ``open`` (builtin, ``io``, ``os.open``) or a rename onto it, seen by an
  audit hook (``sys.addaudithook``) that looks only at the targets' names;
- changed it some other way (a subprocess, a C library): its size, time or inode differ from
  what they were when the run started, and ``run`` did not write it itself.

An audit hook cannot be removed; ``close`` makes it a no-op. It costs a name comparison per
``open`` call, and a ``realpath`` when a name matches a target's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


class ScriptFiles:
    """See the module docstring. ``targets``: the files ``run`` may write (any form of path)."""

    def __init__(self, targets: Iterable[str]) -> None:
        self._targets = {os.path.realpath(t) for t in targets}
        self._names = {os.path.basename(t) for t in self._targets}
        self._at_start = {t: _stat(t) for t in self._targets}
        self._ours: dict[str, tuple[int, int, int] | None] = {}
        self.read: set[str] = set()
        self.written: set[str] = set()
        self._active = False
        self._writing = False

    def install(self) -> None:
        if self._targets:
            self._active = True
            sys.addaudithook(self._audit)

    def close(self) -> None:
        self._active = False

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self._active or self._writing:
            return
        if event == "open":
            path, mode, flags = args
            if self._target(path):
                writes = (any(c in mode for c in "wax+") if isinstance(mode, str)
                          else isinstance(flags, int) and bool(flags & _WRITE_FLAGS))
                (self.written if writes else self.read).add(self._target(path) or "")
        elif event == "os.rename" and len(args) >= 2:
            target = self._target(args[1])
            if target:
                self.written.add(target)

    def _target(self, path: Any) -> str | None:
        """``path``'s real path when it is one of the targets."""
        if isinstance(path, int):
            return None
        try:
            name = os.fsdecode(path)
        except TypeError:
            return None
        if os.path.basename(name) not in self._names:
            return None
        real = os.path.realpath(name)
        return real if real in self._targets else None

    def what_the_script_did(self, target: str) -> str | None:
        """What ``target`` is to the script (``"a file the script imported"``...), or None when
        the script left it alone and ``run`` may write it."""
        real = os.path.realpath(target)
        if real in _imported_files():
            return "a file the script imported"
        if real in self.written:
            return "a file the script wrote during the run"
        if real in self.read:
            return "a file the script read during the run"
        now = _stat(real)
        expected = self._ours.get(real, self._at_start.get(real))
        if now is not None and now != expected:
            return ("a file created during the run" if self._at_start.get(real) is None
                    else "a file changed during the run")
        return None

    def writing(self, target: str, active: bool) -> None:
        """``run`` writes ``target`` itself (``active``), and is done (not ``active``): what it
        wrote is not the script's doing."""
        self._writing = active
        if not active:
            self._ours[os.path.realpath(target)] = _stat(os.path.realpath(target))

    def overwritten_since(self, target: str) -> bool:
        """The script changed ``target`` after ``run`` wrote it."""
        real = os.path.realpath(target)
        return real in self._ours and _stat(real) != self._ours[real]


def _imported_files() -> set[str]:
    files = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            files.add(os.path.realpath(file))
    return files
