"""Whose an exception is: the model's (an op, a module, a loss of the user's, which the scan
reports as ``UserCodeError`` with the user's frame) or nan-hunter's own (a bug, re-raised as it
is). nan-hunter's functions that pass a call on to the user's code mark those lines with
``PASSES_ON_MARK``; an exception out of such a line is the model's."""

from __future__ import annotations

import contextlib
import linecache
import sysconfig
import traceback
from collections.abc import Iterator
from pathlib import Path

from nan_hunter.errors import NOT_THE_MODELS, UserCodeError, first_line
from nan_hunter.precision.gradients import UnmeasuredGradient
from nan_hunter.trace.call_sites import frame_origin, own_module_path
from nan_hunter.trace.deferred import StaleStatistics
from nan_hunter.trace.modules import ModuleTracker


@contextlib.contextmanager
def user_errors(modules: ModuleTracker | None, phase: str) -> Iterator[None]:
    """Re-raise an exception from the user's code with its frame and the modules executed
    (``modules``: the tracker of a pass; none outside one)."""
    try:
        yield
    except (*NOT_THE_MODELS, StaleStatistics, UnmeasuredGradient):
        raise
    except BaseException as exc:
        if _raised_by_nan_hunter(exc):
            raise  # our own bug: an internal error, not the model's
        frame = _last_user_frame(exc)
        where = context = ""
        if modules is not None:
            where = f" in module '{modules.current}'" if modules.current else ""
            executed = ", ".join(repr(m) for m in modules.executed[-3:])
            context = f"; executed modules up to {executed}" if executed else ""
            modules.reset()
        raise UserCodeError(
            f"the model raised {type(exc).__name__} during {phase}{where}: "
            f"{first_line(exc)}{context}",
            user_frame=frame,
        ) from exc


PASSES_ON_MARK = "# passes the call on"
"""Ends each line of a ``_PASSES_ON`` function that calls the user's model, loss, ops or
autograd (or raises an error that is the model's, such as a banned op's)."""

_PASSES_ON = frozenset(
    {
        ("trace/tracer.py", "__torch_function__"), ("trace/tracer.py", "call_or_replay"),
        ("precision/emulation.py", "__torch_dispatch__"),
        ("precision/override.py", "kernel"), ("precision/replay.py", "replay_in_fp32"),
        ("precision/device_alias.py", "<lambda>"), ("precision/device_alias.py", "call"),
        ("runner.py", "run"), ("runner.py", "backward"),
        ("model_state.py", "cast_model"),
    }
)  # fmt: skip
"""nan-hunter's functions that call the user's model, loss, ops or autograd: an exception that
comes out of the call they pass on (a line marked with ``PASSES_ON_MARK``) is the model's if
whoever called them made the call for the model (see ``_raised_by_nan_hunter``); one from any
other of their lines is ours."""

_CALLS_THE_MODEL = frozenset({("runner.py", "run"), ("runner.py", "backward")})
"""The ``_PASSES_ON`` functions that call the model, its loss or autograd for the scan itself:
their callers are nan-hunter's passes, which made the call for the model."""


def _raised_by_nan_hunter(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by nan-hunter's own code (a statistic, the gradient log, a
    hook), not by an op, a module or a function of the user's that it passed a call on to: the
    innermost frame outside torch and Python's standard library is nan-hunter's, and not one of
    ``_PASSES_ON`` at a line that passes the call on; or it is, and the call was passed on for
    nan-hunter's own code (a hook of ours or the tracer's bookkeeping calling a torch function
    that the tracer, the emulation or the device alias passes on): outwards from a pass-on
    frame, the next frame outside torch and the standard library decides, up to the frame
    that called the model (``_CALLS_THE_MODEL``)."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    for frame, line in reversed(frames):
        filename = frame.f_code.co_filename
        origin = frame_origin(filename)
        if origin == "torch" or filename.startswith("<") or _in_stdlib(filename):
            continue  # Python's own code (``<string>``: a dataclass's ``__init__``) passes it on
        if origin == "user":
            return False
        function = (own_module_path(filename), frame.f_code.co_name)
        if function not in _PASSES_ON or not _passes_on(filename, line):
            return True
        if function in _CALLS_THE_MODEL:
            return False
    return False


def _passes_on(filename: str, line: int) -> bool:
    """Whether ``filename``'s ``line`` is marked as passing a call on; without the source (an
    install without .py files), every line of a ``_PASSES_ON`` function counts as such."""
    text = linecache.getline(filename, line)
    return not text or text.rstrip().endswith(PASSES_ON_MARK)


_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + "/"


def _in_stdlib(filename: str) -> bool:
    """Whether ``filename`` is in Python's standard library (not an installed package there)."""
    resolved = Path(filename).resolve().as_posix()
    return resolved.startswith(_STDLIB) and not {"site-packages", "dist-packages"} & set(
        resolved[len(_STDLIB) :].split("/")
    )


def _last_user_frame(exc: BaseException) -> str | None:
    """``file:line`` of the innermost traceback frame in the user's own code."""
    found = None
    for summary in traceback.extract_tb(exc.__traceback__):
        if frame_origin(summary.filename) == "user" and not _in_stdlib(summary.filename):
            found = f"{summary.filename}:{summary.lineno}"
    return found
