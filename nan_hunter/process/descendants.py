"""The processes a scan's model started, wherever they went: found by parentage, not session.

A model may start a helper with ``start_new_session=True`` (or daemonise it by forking twice):
it leaves the scan process's session and process group, so killing the group misses it. On
Linux the scan process makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): whatever
its descendants orphan is re-parented to it, so the whole tree stays below it, and it is
found by walking parent links in ``/proc``. Elsewhere these functions do nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (Linux; no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid``, by parent links (``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # it exited meanwhile
            # pid (comm) state ppid ...: comm may hold spaces and parentheses
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) > 1:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` that still lives."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
