"""Whose an exception out of the model's call is: nan-hunter's own, or the model's.

Ownership is decided where the exception starts, not by reading the traceback afterwards: every
place where our code runs inside the model's call (the tracer's bookkeeping around an op, the
module tracker's and the tracer's hooks, the emulation's and the autocast policy's work around
the op they pass on, the device alias, the device queries, the statistics, the gradient log)
converts its own failures into ``errors.InternalError``; what those places pass on (the op, the
model's hook, the kernel) they leave as it is. So out of the model's call, an ``InternalError``
is ours, re-raised as it is, and any other exception is the model's: ``UserCodeError`` naming
the innermost frame of the user's code.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import sysconfig
import traceback
from collections.abc import Iterator
from pathlib import Path

from nan_hunter.errors import (
    OURS_AS_THEY_ARE,
    InternalError,
    UserCodeError,
    first_line,
    ours_lost_since,
    ours_raised_within,
    unwrap,
)
from nan_hunter.trace.call_sites import frame_origin
from nan_hunter.trace.modules import ModuleTracker


@contextlib.contextmanager
def user_errors(modules: ModuleTracker | None, phase: str) -> Iterator[None]:
    """Around a call of the model's code (its forward, its loss, the backward, its cast):
    an exception out of it is the model's, re-raised as ``UserCodeError`` with the user's frame
    and the modules executed (``modules``: the tracker of a pass; none outside one); an
    ``InternalError``, a signal to the runner (``PassSignal``) and ``NOT_THE_MODELS`` go on as
    they are."""
    mark = ours_raised_within()
    try:
        yield
    except OURS_AS_THEY_ARE as exc:
        ours_lost_since(mark)
        # the model's recursion, run out of stack in a hook or an op of ours
        recursion = _models_recursion(exc, phase) if isinstance(exc, InternalError) else None
        if recursion is not None:
            raise recursion from exc
        raise
    except BaseException as exc:
        lost = ours_lost_since(mark)
        if lost is not None:
            # the model caught ours, then failed on the path it took instead: ours keeps its
            # cause, the model's error becomes its context
            raise lost  # noqa: B904
        recursion = _models_recursion(exc, phase)
        if recursion is not None:
            raise recursion from exc
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
    lost = ours_lost_since(mark)
    if lost is not None:  # the model caught ours and went on
        raise lost


_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + "/"


def _in_stdlib(filename: str) -> bool:
    """Whether ``filename`` is in Python's standard library (not an installed package there)."""
    resolved = Path(filename).resolve().as_posix()
    return resolved.startswith(_STDLIB) and not {"site-packages", "dist-packages"} & set(
        resolved[len(_STDLIB) :].split("/")
    )


def _models_recursion(exc: BaseException, phase: str) -> UserCodeError | None:
    """For a ``RecursionError`` (ours, ``InternalError``, when the stack ran out in our code):
    the model's error naming the line that recursed, when the frame repeated most on the stack
    is the model's (a call of itself) or torch's (modules nested deeper than the stack allows);
    None for any other exception, and for a recursion of our own (a bug of ours)."""
    original = unwrap(exc)
    if not isinstance(original, RecursionError):
        return None
    frames = [*traceback.walk_tb(exc.__traceback__)]
    if original is not exc:
        frames += traceback.walk_tb(original.__traceback__)
    counts = collections.Counter((f.f_code.co_filename, line) for f, line in frames)
    origin = functools.lru_cache(maxsize=None)(frame_origin)
    if not counts or origin(counts.most_common(1)[0][0][0]) == "own":
        return None
    user = [(n, line) for n, line in counts if origin(n) == "user" and not _in_stdlib(n)]
    if user:
        name, line = max(user, key=lambda site: counts[site])  # the first of the most repeated
    subject = f"the model's {phase}" if phase in _CALLS else f"the model, during {phase},"
    where = f" at {name}:{line}" if user else ""
    return UserCodeError(f"{subject} recursed too deep (RecursionError){where}")


_CALLS = frozenset({"forward", "loss_fn", "backward"})


def _last_user_frame(exc: BaseException) -> str | None:
    """``file:line`` of the innermost traceback frame in the user's own code (for the message)."""
    found = None
    for summary in traceback.extract_tb(exc.__traceback__):
        if frame_origin(summary.filename) == "user" and not _in_stdlib(summary.filename):
            found = f"{summary.filename}:{summary.lineno}"
    return found
