"""nan-hunter's own failure in a hook that ``run`` attached to a script: never the script's.

The hooks of ``ScriptWatch`` run inside the script's calls (its model's forward, its
``backward``, ``optimizer.step``, ``GradScaler.step``/``update``, its clipping). Out of them,
with nan-hunter's frames left out of the traceback, a bug of ours would read as the script's
own error at its ``optimizer.step()`` line, or be caught by its ``except Exception`` while the
watch went on half-updated. ``script_entry`` marks each such hook: a failure of ours there (any
``Exception`` but a ``NanHunterError``, such as ``TrainingProblem``) removes the watch from the
script (hooks, replacements, set-aside gradients put back) and ends the script with
``WatchFailed``, a ``SystemExit`` the script's ``except Exception`` does not catch; ``run``
then says what failed, writes no clean report and exits 2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from nan_hunter.errors import NOT_THE_MODELS, InternalError

EXIT_INTERNAL = 2
"""``run``'s exit code after a failure of ours: nothing the script did after it was checked."""


class WatchFailed(SystemExit):
    """Ends the script after a hook of ours failed (``error`` holds our exception)."""

    def __init__(self, hook: str, step: int, error: InternalError) -> None:
        super().__init__(EXIT_INTERNAL)
        self.hook, self.step, self.error = hook, step, error

    def line(self) -> str:
        """What ``run`` says (once; the traceback only with ``NAN_HUNTER_DEBUG=1``)."""
        return (
            f"internal error in {self.hook} at training step {self.step}: {self.error}; "
            "nan-hunter detached and stopped the script (a bug of nan-hunter's, not of the "
            "script: NAN_HUNTER_DEBUG=1 shows its traceback)"
        )


R = TypeVar("R")


def script_entry(hook: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Marks a method of the watch that the script's calls reach (``hook``: what it is, for
    the message); the watch's ``detach_after(hook, exc)`` gives the ``WatchFailed`` to raise."""

    def wrap(method: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(method)
        def entry(self: Any, *args: Any, **kwargs: Any) -> R:
            try:
                return method(self, *args, **kwargs)
            except NOT_THE_MODELS:  # StopRun, WatchFailed, Ctrl-C, TrainingProblem
                raise
            except Exception as exc:
                raise self.detach_after(hook, exc) from exc

        return entry

    return wrap
