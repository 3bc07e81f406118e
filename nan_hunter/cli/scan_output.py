"""How ``nan-hunter scan`` shows what its scan processes returned: the report (one file's, or
the combined one of several), the diff or the patch file, and the exit code as ``typer.Exit``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from nan_hunter.cli.options import EXIT_CLEAN, EXIT_ERROR
from nan_hunter.cli.output import absolute, emit, fail, rendered, write
from nan_hunter.cli.terminal import ColorChoice
from nan_hunter.core.safe_write import refuse_overwrite
from nan_hunter.errors import NanHunterError
from nan_hunter.project.choices import OutputFormat

if TYPE_CHECKING:
    from nan_hunter.findings import Failed, Report
    from nan_hunter.project.config import Settings


@dataclass(frozen=True)
class Output:
    """Flags that say how the reports are shown and where they go."""

    output_format: OutputFormat = OutputFormat.text
    output: Path | None = None
    patch: Path | None = None
    diff: bool = False
    range_map: bool = False
    color: ColorChoice = ColorChoice.auto
    no_color: bool = False
    quiet: bool = False
    exit_zero: bool = False

    @classmethod
    def of(cls, flags: dict[str, Any]) -> Output:
        """From the command's flags, ``-o`` and ``--patch`` made absolute now, against the
        folder nan-hunter was started in (the model's code may chdir); ``-o -`` is standard
        output, as without ``-o``."""
        output = flags.get("output")
        return cls(**{
            **flags,
            "output": absolute(None if str(output) == "-" else output),
            "patch": absolute(flags.get("patch")),
        })  # fmt: skip


def show_reports(
    reports: list[Report],
    failed: list[Failed],
    settings: Settings,
    shown: Output,
    protected: dict[str, str],
    *,
    unsafe: bool,
) -> typer.Exit:
    """Show the report (or the diff) and write the patch file, never over a file the scan read
    or imported (``protected``: the model's package, its siblings); return the exit code as
    ``typer.Exit``. ``unsafe``: the fixes chosen may be unsafe ones (``--unsafe-fixes``)."""
    from nan_hunter.cli.terminal import report_width, wants_color
    from nan_hunter.fixes.edits import render_diff, render_patch
    from nan_hunter.fixes.select import select_fixes
    from nan_hunter.project.paths import shared_root
    from nan_hunter.report import render
    from nan_hunter.report.combined import render_many

    output, patch = shown.output, shown.patch
    try:
        refuse_overwrite(output, patch, protected)
    except NanHunterError as exc:
        raise fail(str(exc)) from None
    use_color = wants_color(ColorChoice.never if shown.no_color else shown.color, sys.stdout)
    options = {
        "color": use_color and output is None,
        "width": report_width(sys.stdout),
        "range_map": shown.range_map,
    }
    output_format = shown.output_format.value
    if len(reports) + len(failed) > 1:
        text = render_many(reports, failed, output_format, **options)  # type: ignore[arg-type]
        emit(text, output, color=use_color, quiet=shown.quiet)
        codes = [r.exit_code(settings.fail_on) for r in reports] + [EXIT_ERROR] * bool(failed)
        return typer.Exit(EXIT_CLEAN if shown.exit_zero and not failed else max(codes))
    report = reports[0]
    code = EXIT_CLEAN if shown.exit_zero else report.exit_code(settings.fail_on)
    selection = select_fixes(report, unsafe=unsafe)
    root = shared_root([Path(report.target.file), *(Path(e.file) for e in selection.edits)])
    if shown.diff:
        typer.echo(rendered(render_diff, selection.edits, root), nl=False)
        return typer.Exit(code)
    emit(
        render(report, output_format, **options),
        output,  # type: ignore[arg-type]
        color=use_color,
        quiet=shown.quiet,
    )
    if patch is not None:
        if selection.edits:
            write(patch, rendered(render_patch, selection.edits, root))
            if not shown.quiet:
                typer.echo(f"nan-hunter: patch written to {patch}", err=True)
        elif not shown.quiet:
            typer.echo("nan-hunter: no patch to write: no finding has a fix to apply", err=True)
    return typer.Exit(code)
