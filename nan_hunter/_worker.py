"""The scan process: runs one job for ``nan_hunter.isolation`` and reports back over a pipe.

Started as ``python -c ...`` with the result pipe's file descriptor as its argument and the job,
pickled, on stdin. Everything the user's code prints (stdout and stderr alike) goes to the pipe
the parent reads as the model's output; only framed pickles go to the result pipe:

- ``("note", text)``: what runs now (a stage, or the module whose forward was entered);
- ``("done", value, imported_files)``; ``("error", message)`` for a ``NanHunterError``;
- ``("exit", code, note)`` when the user's code raised ``SystemExit``;
- ``("internal", summary, traceback_text)`` for anything else (a bug of ours, or of torch).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import sys
import traceback
from typing import Any, BinaryIO


def send(channel: BinaryIO, message: tuple[Any, ...]) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    channel.write(struct.pack("<Q", len(data)) + data)
    channel.flush()


def imported_files() -> tuple[str, ...]:
    """Every file the process imported (the model file, its package, libraries)."""
    files = set()
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if isinstance(name, str):
            files.add(os.path.realpath(name))
    return tuple(sorted(files))


def main() -> None:
    channel = os.fdopen(int(sys.argv[1]), "wb")
    func, arg = pickle.load(sys.stdin.buffer)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the model's code reading stdin gets end-of-file, not our pipe
    os.close(devnull)
    last = [""]

    def note(what: str) -> None:
        if what != last[0]:
            last[0] = what
            send(channel, ("note", what))

    from nan_hunter import activity

    activity.listen(note)
    _watch_modules(note)
    from nan_hunter.errors import NanHunterError

    try:
        value = func(arg)
        message: tuple[Any, ...] = ("done", value, imported_files())
    except NanHunterError as exc:
        message = ("error", str(exc))
    except SystemExit as exc:
        message = ("exit", exc.code, last[0])
    except KeyboardInterrupt:
        message = ("interrupted",)
    except BaseException as exc:
        message = ("internal", _summary(exc), traceback.format_exc())
    activity.listen(None)
    try:
        send(channel, message)
    except Exception as exc:
        send(channel, ("internal", f"cannot send the result back: {_summary(exc)}", ""))
    channel.close()
    for stream in (sys.stdout, sys.stderr):  # the model may have replaced or closed them
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)  # skip interpreter teardown (atexit handlers of the user's code ran their course)


def _summary(exc: BaseException) -> str:
    try:
        text = str(exc).strip().splitlines()
    except Exception:
        text = []
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _watch_modules(note: Any) -> None:
    """Note the module whose forward is entered (a global hook: the model's own hooks and state
    are untouched). Names come from the first module entered that is not known yet: the root."""
    import torch

    names: dict[int, str] = {}

    def entered(module: torch.nn.Module, args: Any) -> None:
        key = id(module)
        if key not in names:
            for name, sub in module.named_modules(remove_duplicate=False):
                names.setdefault(id(sub), name)
        name = names.get(key) or ""
        kind = type(module).__name__
        note(f"running the forward of {name} ({kind})" if name else f"running {kind}.forward")

    torch.nn.modules.module.register_module_forward_pre_hook(entered)
