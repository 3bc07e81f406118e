"""What the command line writes besides the report's text: one error line (exit 2), the report
on stdout or into ``-o``, the patch, and the refusal to write either over a file the scan reads.
Shared by ``scan`` (``nan_hunter.cli.scan_command``) and ``run``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

from nan_hunter.cli.options import EXIT_ERROR
from nan_hunter.core.untrusted import echoed, shown_lines
from nan_hunter.errors import NanHunterError, first_line, unwrap
from nan_hunter.project.targets import visible

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from nan_hunter.findings import Edit

T = TypeVar("T")


def fail(message: str, output: str = "") -> typer.Exit:
    """One error line (the model's text in it capped and its control characters shown escaped:
    ``nan_hunter.core.untrusted``); then, for a failed scan process, what the model's code printed,
    its control characters shown escaped too."""
    typer.echo(f"nan-hunter: error: {echoed(message)}", err=True)
    if output:
        typer.echo(shown_lines(output), err=True, nl=False)
    return typer.Exit(EXIT_ERROR)


def internal_error(exc: BaseException) -> str:
    """One line, even for an exception whose ``__str__`` raises; for an ``InternalError``, the
    original exception's."""
    exc = unwrap(exc)
    try:
        summary = f"{type(exc).__name__}: {first_line(exc)}"
    except Exception:
        summary = type(exc).__name__
    return f"internal error: {summary} (use --debug for a traceback)"


def error_line(exc: Exception, debug: bool) -> tuple[str, str]:
    """The one line an error ends in, and what the model's code printed before it (a failed
    scan process's output); a bug of ours (not a ``NanHunterError``) is re-raised as it is
    with ``--debug``."""
    if isinstance(exc, NanHunterError):
        return str(exc), getattr(exc, "output", "")
    if debug:
        raise exc
    return internal_error(exc), ""


def absolute(path: Path | None) -> Path | None:
    return None if path is None else Path(os.path.abspath(path))


def read_files(
    specs: list[str],
    weights: Path | None,
    batch_file: Path | None,
    config: Path | None,
    settings_files: Iterable[Path] = (),
) -> dict[str, str]:
    """Real path -> what it is, for every file the scan reads that we know of before it runs
    (``settings_files``: the defaults and the discovered project file, the settings it read)."""
    named: list[tuple[str, Path | None]] = [
        ("a settings file the scan read", p) for p in settings_files
    ]
    named += [("the model file", Path(s)) for s in specs if s.endswith(".py") or visible(Path(s))]
    named += [
        ("the --weights file", weights),
        ("the --batch-file file", batch_file),
        ("the --config file", config),
    ]
    return {os.path.realpath(p): what for what, p in named if p is not None}


def emit(text: str, output: Path | None, *, color: bool = False, quiet: bool = False) -> None:
    """The report on stdout, or into ``output`` with a note on stderr (none when ``quiet``)."""
    if output is not None:
        write(output, text)
        if not quiet:
            typer.echo(f"nan-hunter: report written to {output}", err=True)
    else:  # color=True: click would strip the colour codes from a pipe otherwise
        typer.echo(text, nl=False, color=color or None)


def rendered(render: Callable[[Iterable[Edit], Path], T], edits: Iterable[Edit], root: Path) -> T:
    """The fixes' diff or patch, from the files as they are now; one line, exit 2, when one
    changed since the scan (``EditConflict``)."""
    try:
        return render(edits, root)
    except NanHunterError as exc:
        raise fail(str(exc)) from None


def write(path: Path, text: str | bytes) -> None:
    from nan_hunter.core.safe_write import write_file

    try:
        write_file(path, text)
    except NanHunterError as exc:
        raise fail(str(exc)) from None


