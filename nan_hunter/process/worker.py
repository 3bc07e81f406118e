"""The scan process: runs one job for ``nan_hunter.process.isolation`` and reports back over a pipe.

Started as ``python -c ...`` with the result pipe's and the note board's file descriptors and the
parent's pid as arguments, and the job, pickled, on stdin. Everything the user's code prints
(stdout and stderr alike) goes to the pipe the parent reads as the model's output; what runs now
goes to the note board (``NoteBoard``); one framed pickle goes to the result pipe at the end:

- ``("done", value, imported_files)``; ``("error", message)`` for a ``NanHunterError``;
- ``("exit", code, note)`` when the user's code raised ``SystemExit``;
- ``("internal", summary, traceback_text)`` for anything else (a bug of ours, or of torch).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import signal
import struct
import sys
import traceback
import warnings
from typing import Any, BinaryIO


def quiet_torch_numpy_warning() -> None:
    """torch's CPU wheels do not depend on numpy, and without it ``import torch`` warns "Failed
    to initialize NumPy"; nan-hunter never needs numpy, so the CLI and the scan process hide
    exactly that warning (before anything imports torch)."""
    warnings.filterwarnings(
        "ignore", message=r"Failed to initialize NumPy", category=UserWarning
    )


def send(channel: BinaryIO, message: tuple[Any, ...]) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    channel.write(struct.pack("<Q", len(data)) + data)
    channel.flush()


def imported_files() -> tuple[str, ...]:
    """Every file the process imported (the model file, its package, libraries)."""
    from nan_hunter.project.paths import real_path

    files = set()
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if isinstance(name, str):
            files.add(real_path(name))
    return tuple(sorted(files))


SLOT_BYTES = 2048
NOTE_BYTES = 2 * SLOT_BYTES
"""The shared note board: two slots (the stage, then the module), each a 4-byte length and UTF-8."""


class NoteBoard:
    """What runs now, in memory shared with the parent (a file both map): a note costs a memory
    copy, not a pipe write, so the module slot can be updated on every module call. The stage
    slot holds what ``nan_hunter.core.progress.announce`` said last (``importing model.py``, ``FP32
    reference pass``); the parent shows it as progress, and both when the process dies."""

    def __init__(self, fd: int) -> None:
        self.map = mmap.mmap(fd, NOTE_BYTES)
        self.last_stage = ""
        self.last_module = ""

    def stage(self, what: str) -> None:
        self.last_stage = what
        self._put(0, what)
        self.module("")  # no module has been entered in the new stage yet

    def module(self, what: str) -> None:
        if what is self.last_module:
            return
        self.last_module = what
        self._put(SLOT_BYTES, what)

    def describe(self) -> str:
        return describe(self.last_stage, self.last_module)

    def _put(self, at: int, what: str) -> None:
        data = what.encode("utf-8", "replace")[: SLOT_BYTES - 4]
        self.map[at + 4 : at + 4 + len(data)] = data
        self.map[at : at + 4] = struct.pack("<I", len(data))


def read_notes(fd: int) -> tuple[str, str]:
    """(stage, module) from the board file ``fd``."""
    raw = os.pread(fd, NOTE_BYTES, 0)
    return _slot(raw, 0), _slot(raw, SLOT_BYTES)


def _slot(raw: bytes, at: int) -> str:
    if len(raw) < at + 4:
        return ""
    (size,) = struct.unpack("<I", raw[at : at + 4])
    return raw[at + 4 : at + 4 + min(size, SLOT_BYTES - 4)].decode("utf-8", "replace")


def describe(stage: str, module: str) -> str:
    """``running the forward of fc (Linear) (FP32 reference pass)``, or what is known of it."""
    if module and stage:
        return f"{module} ({stage})"
    return module or stage


PIPE_LOST = "the model's code closed the descriptors of nan-hunter's result pipe"
"""The stage the scan process leaves on the note board when it cannot send its result."""
PIPE_LOST_STATUS = 121


def _identity(fd: int) -> tuple[int, int] | None:
    """(device, inode) of what ``fd`` refers to now, or None when it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _spare(fd: int) -> int:
    """A duplicate of ``fd`` at a high number (-1 when none can be made)."""
    try:
        import fcntl

        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1000)
    except (OSError, ImportError, AttributeError):
        return -1


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when the CLI dies (SIGTERM/SIGKILL from CI), though
    it runs in a session of its own."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before that
        os._exit(1)


def main() -> None:
    from nan_hunter.process.descendants import become_subreaper, descendants, kill_all

    _die_with_parent(int(sys.argv[3]))
    become_subreaper()  # what the model starts in a session of its own stays below this one
    if os.environ.get("NAN_HUNTER_DEBUG"):
        import faulthandler

        faulthandler.enable()  # a crash in native code prints the Python stack (after our line)
    quiet_torch_numpy_warning()
    channel_fd = int(sys.argv[1])
    pipe = _identity(channel_fd)
    spare = _spare(channel_fd)  # a copy far above the usual os.closerange(3, 256)
    board = NoteBoard(int(sys.argv[2]))
    func, arg = pickle.load(sys.stdin.buffer)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the model's code reading stdin gets end-of-file, not our pipe
    os.close(devnull)

    from nan_hunter.core.progress import listening
    from nan_hunter.errors import NanHunterError
    from nan_hunter.process import activity
    from nan_hunter.project.loader import use_own_module_names

    use_own_module_names()  # this process ends with the scan: model files keep their names
    _watch_modules(board.module)
    activity.listen(board.stage)
    try:
        with listening(board.stage):
            value = func(arg)
        message: tuple[Any, ...] = ("done", value, imported_files())
    except NanHunterError as exc:
        message = ("error", str(exc))
    except SystemExit as exc:
        message = ("exit", exc.code, board.describe())
    except KeyboardInterrupt:
        message = ("interrupted",)
    except BaseException as exc:
        message = ("internal", _summary(exc), traceback.format_exc())
    activity.listen(None)
    live = next((fd for fd in (channel_fd, spare) if fd >= 0 and _identity(fd) == pipe), None)
    if live is None:  # the model closed (or reused) every descriptor of our result pipe
        board.stage(PIPE_LOST)
        kill_all(descendants(os.getpid()))
        os._exit(PIPE_LOST_STATUS)
    channel = os.fdopen(live, "wb")
    try:
        send(channel, message)
    except Exception as exc:
        send(channel, ("internal", f"cannot send the result back: {_summary(exc)}", ""))
    channel.close()
    for stream in (sys.stdout, sys.stderr):  # the model may have replaced or closed them
        with contextlib.suppress(Exception):
            stream.flush()
    kill_all(descendants(os.getpid()))  # the model's helpers end with the scan
    os._exit(0)  # skip interpreter teardown (atexit handlers of the user's code ran their course)


def _summary(exc: BaseException) -> str:
    """``Type: first line`` of ``exc``; of the original exception for an ``InternalError``
    (its traceback, which ``--debug`` shows, holds both)."""
    from nan_hunter.errors import unwrap

    exc = unwrap(exc)
    try:
        text = str(exc).strip().splitlines()
    except Exception:  # its __str__ raises: the type alone
        text = []
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _watch_modules(note: Any) -> None:
    """Note the module whose forward is entered (a global hook: the model's own hooks and state
    are untouched). Names come from the first module entered that is not known yet: the root."""
    import torch

    notes: dict[int, str] = {}

    def entered(module: torch.nn.Module, args: Any) -> None:
        text = notes.get(id(module))
        if text is None:
            for name, sub in module.named_modules(remove_duplicate=False):
                kind = type(sub).__name__
                where = f"the forward of {name} ({kind})" if name else f"{kind}.forward"
                notes.setdefault(id(sub), f"running {where}")
            text = notes[id(module)]
        note(text)

    torch.nn.modules.module.register_module_forward_pre_hook(entered)
