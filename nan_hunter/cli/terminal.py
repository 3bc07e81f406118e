"""The terminal side of the CLI: colour, report width, the progress display on stderr.

Colour (``--color auto|always|never``): ``always`` and ``never`` decide; ``auto`` (the default)
follows ``NO_COLOR`` (set and non-empty: no colour), then ``FORCE_COLOR`` (set and non-empty:
colour), then whether the report goes to a terminal. A report written to a file has no colour.

Width: on a terminal the text report and ``rules`` are laid out to its width (``COLUMNS`` when
set), 80 columns at least; anywhere else (a pipe, a file, CI logs) lines are written whole.

Progress: a rich display on stderr (passes, training steps, fix verification, files), only when
stderr is a terminal and not ``--quiet``; it is transient and leaves nothing behind.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from nan_hunter.core.progress import listening

MIN_WIDTH = 80
"""The narrowest layout of the text report and ``rules``."""


class ColorChoice(str, enum.Enum):
    auto = "auto"
    always = "always"
    never = "never"


def wants_color(
    choice: ColorChoice, stream: TextIO, env: Mapping[str, str] | None = None
) -> bool:
    env = os.environ if env is None else env
    if choice is ColorChoice.always:
        return True
    if choice is ColorChoice.never:
        return False
    if env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR"):
        return True
    return _isatty(stream)


def report_width(stream: TextIO) -> int | None:
    """The columns to lay the text report out to: the terminal's (at least 80), or None (lines
    unwrapped) when ``stream`` is not a terminal."""
    if not _isatty(stream):
        return None
    return max(Console(file=stream).width, MIN_WIDTH)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressDisplay:
    """What the CLI is doing, on stderr: one line for the current file and step."""

    def __init__(self, progress: Progress | None, files: int) -> None:
        self._progress = progress
        self._task = None
        self._files = files
        self._file = ""
        if progress is not None:
            self._task = progress.add_task("starting", total=files if files > 1 else None)

    def file(self, path: str) -> None:
        self._file = path
        self.step("loading")

    def file_done(self) -> None:
        if self._progress is not None and self._task is not None and self._files > 1:
            self._progress.advance(self._task)

    def step(self, what: str) -> None:
        if self._progress is None or self._task is None:
            return
        where = f"{self._file}: " if self._file else ""
        self._progress.update(self._task, description=f"{where}{what}")


@contextmanager
def progress_display(*, enabled: bool, files: int = 1) -> Iterator[ProgressDisplay]:
    """A progress display on stderr while the block runs (a no-op one when not ``enabled`` or
    when stderr is not a terminal); library code's ``announce()`` calls update it."""
    if not enabled or not _isatty(sys.stderr):
        yield ProgressDisplay(None, files)
        return
    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if files > 1:
        columns += [BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    console = Console(file=sys.stderr)
    with Progress(*columns, console=console, transient=True) as progress:
        display = ProgressDisplay(progress, files)
        with listening(display.step):
            yield display
