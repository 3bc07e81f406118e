"""What ``nan-hunter scan`` does below its typer declarations: settings from the flags, one
scan process per model file (``nan_hunter.process.isolation``), then the report, the patch or the
diff, and the exit code: 0 clean, 1 findings at or above ``--fail-on``, 2 usage, load or internal
errors (one line on stderr, no traceback unless ``NAN_HUNTER_DEBUG=1``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nan_hunter.cli.output import error_line, fail, read_files
from nan_hunter.cli.scan_output import Output, show_reports
from nan_hunter.core.safe_write import refuse_overwrite
from nan_hunter.core.untrusted import echoed, shown_lines
from nan_hunter.errors import NanHunterError
from nan_hunter.process.scan_process import ScanJob, scan_job

if TYPE_CHECKING:
    from nan_hunter.findings import Failed, Report
    from nan_hunter.project.config import Settings


SETTING_FLAGS = {
    "dtype": "dtype", "device": "device", "policy": "policy", "mode": "mode",
    "numerics": "numerics", "backward": "backward", "grad_scale": "grad_scale",
    "select": "select", "ignore": "ignore", "fail_on": "fail_on", "min_headroom": "min_headroom",
    "precision_check": "precision_check",
    "verify": "verify_fixes", "lr": "lr",
}  # fmt: skip
"""Flags that override a setting (``configs/default.yaml``, the project's file, ``--config``):
flag name -> setting key."""

JOB_FLAGS = frozenset(
    f.name for f in dataclasses.fields(ScanJob) if f.name not in ("path", "settings")
)
"""Flags that say what each model file's scan process runs
(``nan_hunter.process.scan_process.ScanJob``)."""


@dataclass(frozen=True)
class ScanCommand:
    """``nan-hunter scan``'s flags, split once: the paths, the settings they override, the job
    each scan process runs, how the result is shown, and the process limits."""

    paths: list[str]
    config: Path | None
    overrides: dict[str, object]
    job: dict[str, object]
    output: Output
    timeout: float | None = None
    debug: bool = False

    @classmethod
    def partition(cls, flags: dict[str, object]) -> ScanCommand:
        """Split the command's parsed flags (as typer passes them) by where each goes; a flag
        that goes nowhere is a bug of ours."""

        def plain(value: object) -> object:
            return getattr(value, "value", value)  # an enum choice -> its setting's value

        outputs = {f.name for f in dataclasses.fields(Output)}
        known = {"paths", "config", "timeout", "debug", *SETTING_FLAGS, *JOB_FLAGS, *outputs}
        unknown = sorted(set(flags) - known)
        if unknown:
            raise TypeError(f"scan flags with no destination: {', '.join(unknown)}")
        return cls(
            paths=list(flags["paths"]),  # type: ignore[call-overload]
            config=flags["config"],  # type: ignore[arg-type]
            overrides={key: plain(flags[f]) for f, key in SETTING_FLAGS.items()},
            job={f: flags[f] for f in JOB_FLAGS},
            output=Output.of({f: flags[f] for f in outputs}),
            timeout=flags["timeout"],  # type: ignore[arg-type]
            debug=bool(flags["debug"]) or bool(os.environ.get("NAN_HUNTER_DEBUG")),
        )


def run_scan(command: ScanCommand) -> None:
    """Settings, then one scan process per model file, then the report: always ends in
    ``typer.Exit`` with the exit code."""
    settings, files, inputs = _prepare(command)
    reports, failed = _scan_files(command, settings, files, inputs)
    unsafe = bool(command.job["unsafe_fixes"])
    raise show_reports(reports, failed, settings, command.output, inputs, unsafe=unsafe)


def _prepare(command: ScanCommand) -> tuple[Settings, list[str], dict[str, str]]:
    """The settings, the model files and the files the scan reads (never written over)."""
    from nan_hunter.project.config import DEFAULT_CONFIG, load_settings
    from nan_hunter.project.discovery import discover, search_start
    from nan_hunter.project.targets import expand_paths

    job = command.job
    try:
        project = discover(search_start(command.paths))
        settings = load_settings(command.config, command.overrides, project=project)
        if job["steps"] is not None and (job["fix"] or job["fix_all"]):
            raise NanHunterError("--steps cannot be combined with --fix or --fix-all")
        batch_fn = job["batch_fn"] if job["batch_file"] is None else None
        files = expand_paths(command.paths, job["model_fn"], batch_fn)  # type: ignore[arg-type]
        shown = command.output
        if len(files) > 1 and (shown.diff or shown.patch is not None):
            raise NanHunterError("--diff and --patch take one model file, not several")
        read = [DEFAULT_CONFIG, *([project.path] if project is not None else [])]
        inputs = read_files(
            files, job["weights"], job["batch_file"], command.config, read  # type: ignore[arg-type]
        )
        refuse_overwrite(shown.output, shown.patch, inputs)
    except Exception as exc:
        raise fail(*error_line(exc, command.debug)) from None
    return settings, files, inputs


def _scan_files(
    command: ScanCommand, settings: Settings, files: list[str], inputs: dict[str, str]
) -> tuple[list[Report], list[Failed]]:
    """Each model file's report from its own scan process (``nan_hunter.process.isolation``); with
    one file, its failure ends the command; with several, it is listed and the others go on."""
    from nan_hunter.cli.terminal import progress_display
    from nan_hunter.findings import Failed
    from nan_hunter.process.isolation import run_isolated
    from nan_hunter.project.targets import check_model_file

    def scan_one(path: str) -> Report:
        if path.endswith(".py"):  # said before a scan process starts (and imports torch)
            check_model_file(path)
        job = ScanJob(path=path, settings=settings, **command.job)  # type: ignore[arg-type]
        isolated = run_isolated(
            scan_job, job, timeout=command.timeout, debug=command.debug, on_step=shown.step
        )
        inputs.update((name, "a file the scan imported") for name in isolated.imported)
        report: Report = isolated.value
        return report

    reports: list[Report] = []
    failed: list[Failed] = []
    with progress_display(enabled=not command.output.quiet, files=len(files)) as shown:
        for path in files:
            shown.file(path)
            try:
                reports.append(scan_one(path))
            except Exception as exc:
                message, printed = error_line(exc, command.debug)
                if len(files) == 1:
                    raise fail(message, printed) from None
                typer.echo(f"nan-hunter: error: {echoed(f'{path}: {message}')}", err=True)
                typer.echo(shown_lines(printed), err=True, nl=False)
                failed.append(Failed(path, message))
            shown.file_done()
    return reports, failed
