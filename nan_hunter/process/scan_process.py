"""What one model file's scan runs in its scan process (``nan_hunter.process.isolation``): the scan,
then ``--steps``, ``--fix-all``, the fixes' verification and ``--fix``.

Kept apart from the command line (``nan_hunter.cli.scan_command``) so that the scan process imports
neither typer nor rich: it starts on every ``nan-hunter scan``, and what it imports beyond the
model's own needs is part of what a scan costs. What it says goes to stderr, which the CLI
forwards after a scan (``nan_hunter.process.isolation``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nan_hunter.core.untrusted import shown
from nan_hunter.findings import loss_change_text

if TYPE_CHECKING:
    from nan_hunter.findings import Report
    from nan_hunter.fixes.workflow import Applied
    from nan_hunter.project.config import Settings


@dataclass(frozen=True)
class ScanJob:
    """What one model file's scan runs in its scan process (see ``nan_hunter.process.isolation``);
    the fields after ``settings`` are ``scan``'s flags of the same names."""

    path: str
    settings: Settings
    model_fn: str = "build_model"
    batch_fn: str = "sample_batch"
    loss_fn: str = "loss_fn"
    weights: Path | None = None
    batch_file: Path | None = None
    steps: int | None = None
    fix: bool = False
    fix_all: bool = False
    rounds: int = 5
    unsafe_fixes: bool = False
    backup: bool = True


def scan_job(job: ScanJob) -> Report:
    """The report of one model file, after --steps, --fix-all, verification and --fix: the part
    of ``scan`` that runs the user's code."""
    from nan_hunter.api import scan_file
    from nan_hunter.fixes.workflow import apply_fixes
    from nan_hunter.fixes.workflow import fix_all as run_fix_all
    from nan_hunter.project.loader import Names, load_target, model_folder
    from nan_hunter.project.suppressions import apply_suppressions
    from nan_hunter.training import run_steps

    path, settings, weights, batch_file = job.path, job.settings, job.weights, job.batch_file
    steps, fix, fix_all, rounds, unsafe_fixes, backup = (
        job.steps, job.fix, job.fix_all, job.rounds, job.unsafe_fixes, job.backup
    )
    names = Names(job.model_fn, job.batch_fn, job.loss_fn)
    # scan_file verifies each fix (nan_hunter.fixes.verify); --fix and --fix-all need it
    verifying = settings.verify_fixes or fix or fix_all

    def rescan(_file: Path) -> Report:
        """The model as the user named it (a ``pkg.module`` stays a module: its relative
        imports need the package), not the file the report points to."""
        return scan_file(
            path, settings, names=names, weights=weights, batch_file=batch_file,
            verify=verifying,
        )

    with model_folder(path):  # lazy sibling imports keep working for the whole run
        if steps is not None:
            result = run_steps(
                load_target(path, names, weights=weights, batch_file=batch_file), settings, steps
            )
            where = (
                f"step {result.first_bad_step} broke: {result.detail}"
                if result.first_bad_step is not None
                else "no step broke; scanned the final weights"
            )
            _say(f"nan-hunter: trained {result.steps_run} step(s); {where}")
            report = apply_suppressions(result.report)
        else:
            report = scan_file(
                path, settings, names=names, weights=weights, batch_file=batch_file,
                verify=verifying and not fix_all,
            )
        if fix_all:
            outcome = run_fix_all(
                Path(report.target.file), rescan, rounds=rounds, unsafe=unsafe_fixes,
                backup=backup,
            )
            for r in outcome.rounds:
                _say_applied(r.applied, f"round {r.number}: ")
            if outcome.stopped != "clean":
                _say(f"nan-hunter: --fix-all stopped: {outcome.stopped}")
            report = outcome.report
        if fix and not fix_all:
            applied = apply_fixes(report, unsafe=unsafe_fixes, backup=backup)
            _say_applied(applied, "")
            if any(a.fixed for a in applied):
                report = rescan(Path(report.target.file))
    return report


def _say_applied(applied: list[Applied] | tuple[Applied, ...], prefix: str) -> None:
    for a in applied:
        if a.fixed:
            kept = f" (original kept as {a.backup.name})" if a.backup else ""
            codes = ", ".join(f.code for f in a.fixed)
            _say(f"nan-hunter: {prefix}fixed {codes} in {a.file}{kept}")
        for f, why in a.skipped:
            _say(f"nan-hunter: {prefix}not fixed: {f.code} ({why})")
        for f, fix in a.passed_over:
            measured = (
                f": {loss_change_text(fix.fp32_loss_change)}"
                if fix.fp32_loss_change is not None else ""
            )
            _say(f"nan-hunter: {prefix}{f.code}: a cheaper, unsafe fix was not taken "
                 f"({fix.title}{measured}); --unsafe-fixes takes it")


def _say(message: str) -> None:
    """``message`` on stderr, even when the model's code closed or replaced ``sys.stderr``: the
    report must not be lost to a note about it (a file already fixed and the scan "failed")."""
    message = shown(message)  # file names and reasons from the model: one line, no controls
    for stream in (sys.stderr, sys.__stderr__):
        if stream is None:  # print(file=None) would write to stdout, where the report goes
            continue
        try:
            print(message, file=stream, flush=True)
            return
        except Exception:  # closed, detached, or a replacement that raises
            continue
    with contextlib.suppress(OSError):
        os.write(2, f"{message}\n".encode(errors="replace"))
