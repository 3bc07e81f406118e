"""What ``nan-hunter scan`` does below its typer declarations: settings from the flags, one
scan process per model file (``nan_hunter.isolation``), then the report, the patch or the diff,
and the exit code: 0 clean, 1 findings at or above ``--fail-on``, 2 usage, load or internal
errors (one line on stderr, no traceback unless ``NAN_HUNTER_DEBUG=1``)."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

from nan_hunter.choices import Device, DType, FailOn, Mode, Numerics, OutputFormat, Policy
from nan_hunter.cli_options import EXIT_CLEAN, EXIT_ERROR
from nan_hunter.errors import NanHunterError, first_line
from nan_hunter.scan_job import ScanJob, scan_job
from nan_hunter.targets import visible
from nan_hunter.terminal import ColorChoice
from nan_hunter.untrusted import echoed, shown_lines

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from nan_hunter.findings import Edit, Report

T = TypeVar("T")


@dataclass(frozen=True)
class ScanRequest:
    """The arguments of ``nan-hunter scan``, as typer parsed them."""

    paths: list[str]
    model_fn: str
    batch_fn: str
    loss_fn: str
    weights: Path | None
    batch_file: Path | None
    dtype: DType | None
    device: Device | None
    policy: Policy | None
    mode: Mode | None
    numerics: Numerics | None
    backward: bool | None
    grad_scale: str | None
    config: Path | None
    output_format: OutputFormat
    output: Path | None
    patch: Path | None
    select: list[str] | None
    ignore: list[str] | None
    fail_on: FailOn | None
    min_headroom: float | None
    range_map: bool
    exit_zero: bool
    color: ColorChoice
    no_color: bool
    quiet: bool
    diff: bool
    fix: bool
    unsafe_fixes: bool
    fix_all: bool
    rounds: int
    backup: bool
    verify: bool | None
    lr: float | None
    steps: int | None
    timeout: float | None
    debug: bool


def run_scan(request: ScanRequest) -> None:
    """Run the scan the command line asked for; always ends in ``typer.Exit`` with the code."""
    (
        paths, model_fn, batch_fn, loss_fn, weights, batch_file, dtype, device, policy,
        mode, numerics, backward, grad_scale, config, output_format, output, patch, select,
        ignore, fail_on, min_headroom, range_map, exit_zero, color, no_color, quiet, diff, fix,
        unsafe_fixes, fix_all, rounds, backup, verify, lr, steps, timeout, debug,
    ) = (getattr(request, f.name) for f in dataclasses.fields(request))
    from nan_hunter.config import DEFAULT_CONFIG, load_settings
    from nan_hunter.discovery import discover, search_start
    from nan_hunter.fixes.edits import render_diff, render_patch
    from nan_hunter.fixes.select import select_fixes
    from nan_hunter.isolation import run_isolated
    from nan_hunter.project import shared_root
    from nan_hunter.targets import check_model_file, expand_paths
    from nan_hunter.terminal import progress_display, report_width, wants_color

    debug = debug or bool(os.environ.get("NAN_HUNTER_DEBUG"))
    # Resolved now, against the folder nan-hunter was started in: the model's code may chdir.
    # "-o -" is standard output, as without -o.
    output, patch = _absolute(None if str(output) == "-" else output), _absolute(patch)
    try:
        project = discover(search_start(paths))
        settings = load_settings(
            config,
            {
                "dtype": dtype.value if dtype else None,
                "device": device.value if device else None,
                "policy": policy.value if policy else None,
                "mode": mode.value if mode else None,
                "numerics": numerics.value if numerics else None,
                "backward": backward,
                "grad_scale": grad_scale,
                "select": select,
                "ignore": ignore,
                "fail_on": fail_on.value if fail_on else None,
                "min_headroom": min_headroom,
                "verify_fixes": verify,
                "lr": lr,
            },
            project=project,
        )
        if steps is not None and (fix or fix_all):
            raise NanHunterError("--steps cannot be combined with --fix or --fix-all")
        files = expand_paths(paths, model_fn, batch_fn if batch_file is None else None)
        if len(files) > 1 and (diff or patch is not None):
            raise NanHunterError("--diff and --patch take one model file, not several")
        read = [DEFAULT_CONFIG, *([project.path] if project is not None else [])]
        inputs = _inputs(files, weights, batch_file, config, read)
        _refuse_overwrite(output, patch, inputs)
    except NanHunterError as exc:
        raise fail(str(exc)) from None
    except Exception as exc:  # a bug of ours: say so in one line
        if debug:
            raise
        raise fail(_internal(exc)) from None

    def scan_one(path: str) -> Report:
        """The report of one model file, from its own scan process (``nan_hunter.isolation``)."""
        if path.endswith(".py"):  # said before a scan process starts (and imports torch)
            check_model_file(path)
        job = ScanJob(
            path, settings, (model_fn, batch_fn, loss_fn), weights, batch_file, steps, fix,
            fix_all, rounds, unsafe_fixes, backup,
        )
        isolated = run_isolated(scan_job, job, timeout=timeout, debug=debug, on_step=shown.step)
        inputs.update((name, "a file the scan imported") for name in isolated.imported)
        report: Report = isolated.value
        return report

    from nan_hunter.findings import Failed

    reports: list[Report] = []
    failed: list[Failed] = []
    with progress_display(enabled=not quiet, files=len(files)) as shown:
        for path in files:
            shown.file(path)
            try:
                reports.append(scan_one(path))
            except NanHunterError as exc:
                output_text = getattr(exc, "output", "")
                if len(files) == 1:
                    raise fail(str(exc), output_text) from None
                typer.echo(f"nan-hunter: error: {echoed(f'{path}: {exc}')}", err=True)
                typer.echo(shown_lines(output_text), err=True, nl=False)
                failed.append(Failed(path, str(exc)))
            except Exception as exc:  # a bug of ours: say so in one line
                if debug:
                    raise
                message = _internal(exc)
                if len(files) == 1:
                    raise fail(message) from None
                typer.echo(f"nan-hunter: error: {echoed(f'{path}: {message}')}", err=True)
                failed.append(Failed(path, message))
            shown.file_done()

    from nan_hunter.report import render
    from nan_hunter.report.combined import render_many

    try:  # nothing written over a file the scan imported (the model's package, its siblings)
        _refuse_overwrite(output, patch, inputs)
    except NanHunterError as exc:
        raise fail(str(exc)) from None

    use_color = wants_color(ColorChoice.never if no_color else color, sys.stdout)
    width = report_width(sys.stdout)
    if len(files) > 1:
        text = render_many(
            reports, failed, output_format.value, color=use_color and output is None, width=width,
            range_map=range_map,
        )
        _emit(text, output, color=use_color, quiet=quiet)
        codes = [r.exit_code(settings.fail_on) for r in reports] + [EXIT_ERROR] * bool(failed)
        raise typer.Exit(EXIT_CLEAN if exit_zero and not failed else max(codes))
    report = reports[0]
    selection = select_fixes(report, unsafe=unsafe_fixes)
    root = shared_root([Path(report.target.file), *(Path(e.file) for e in selection.edits)])
    if diff:
        typer.echo(_rendered(render_diff, selection.edits, root), nl=False)
        code = report.exit_code(settings.fail_on)
        raise typer.Exit(EXIT_CLEAN if exit_zero else code)
    text = render(
        report, output_format.value, color=use_color and output is None, width=width,
        range_map=range_map,
    )
    _emit(text, output, color=use_color, quiet=quiet)
    if patch is not None:
        if selection.edits:
            _write(patch, _rendered(render_patch, selection.edits, root))
            if not quiet:
                typer.echo(f"nan-hunter: patch written to {patch}", err=True)
        elif not quiet:
            typer.echo("nan-hunter: no patch to write: no finding has a fix to apply", err=True)
    code = report.exit_code(settings.fail_on)
    raise typer.Exit(EXIT_CLEAN if exit_zero else code)


def fail(message: str, output: str = "") -> typer.Exit:
    """One error line (the model's text in it capped and its control characters shown escaped:
    ``nan_hunter.untrusted``); then, for a failed scan process, what the model's code printed,
    its control characters shown escaped too."""
    typer.echo(f"nan-hunter: error: {echoed(message)}", err=True)
    if output:
        typer.echo(shown_lines(output), err=True, nl=False)
    return typer.Exit(EXIT_ERROR)


def _internal(exc: BaseException) -> str:
    """One line, even for an exception whose ``__str__`` raises."""
    try:
        summary = f"{type(exc).__name__}: {first_line(exc)}"
    except Exception:
        summary = type(exc).__name__
    return f"internal error: {summary} (use --debug for a traceback)"


def _absolute(path: Path | None) -> Path | None:
    return None if path is None else Path(os.path.abspath(path))


def _inputs(
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


def _refuse_overwrite(output: Path | None, patch: Path | None, protected: dict[str, str]) -> None:
    for target, what in ((output, "report"), (patch, "patch")):
        real = os.path.realpath(target) if target is not None else None
        if real is not None and real in protected:
            raise NanHunterError(
                f"refusing to write the {what} to {target}: it is {protected[real]}; "
                "choose another file"
            )


def _emit(text: str, output: Path | None, *, color: bool = False, quiet: bool = False) -> None:
    """The report on stdout, or into ``output`` with a note on stderr (none when ``quiet``)."""
    if output is not None:
        _write(output, text)
        if not quiet:
            typer.echo(f"nan-hunter: report written to {output}", err=True)
    else:  # color=True: click would strip the colour codes from a pipe otherwise
        typer.echo(text, nl=False, color=color or None)


def _rendered(render: Callable[[Iterable[Edit], Path], T], edits: Iterable[Edit], root: Path) -> T:
    """The fixes' diff or patch, from the files as they are now; one line, exit 2, when one
    changed since the scan (``EditConflict``)."""
    try:
        return render(edits, root)
    except NanHunterError as exc:
        raise fail(str(exc)) from None


def _write(path: Path, text: str | bytes) -> None:
    from nan_hunter.safe_write import write_file

    try:
        write_file(path, text)
    except NanHunterError as exc:
        raise fail(str(exc)) from None


