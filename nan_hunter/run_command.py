"""What ``nan-hunter run`` does below its typer declaration, in the command line's own
(torch-free) process: check the arguments, build the settings of the re-run, start the script's
process (``run_job``) and exit with its exit code.

The script's process shares our terminal: its stdin, stdout and stderr are ours, and Ctrl-C
reaches it directly (we ignore SIGINT while it runs, and die of the signal that ended it). When
our stdout or stderr is not a real file (a test's ``CliRunner``), its output is copied into them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import typer

from nan_hunter.choices import DType, OutputFormat, Policy
from nan_hunter.command_output import fail
from nan_hunter.errors import NanHunterError
from nan_hunter.run_job import _HOME, BOOT, ON_PROBLEM_CHOICES, RunJob
from nan_hunter.terminal import ColorChoice


@dataclass(frozen=True)
class RunRequest:
    """The arguments of ``nan-hunter run``, as typer parsed them."""

    args: list[str]
    module: str | None
    on_problem: str
    max_steps: int | None
    policy: Policy | None
    dtype: DType | None
    config: Path | None
    output_format: OutputFormat
    output: Path | None
    patch: Path | None
    verify: bool | None
    quiet: bool


def run_script(request: RunRequest) -> None:
    """Run the script; always ends in ``typer.Exit`` with the script's process's exit code."""
    from nan_hunter.command_output import refuse_overwrite
    from nan_hunter.config import load_settings
    from nan_hunter.discovery import discover, search_start
    from nan_hunter.terminal import report_width, wants_color

    args = list(request.args)
    try:
        if request.on_problem not in ON_PROBLEM_CHOICES:
            raise NanHunterError(
                f"--on-problem must be one of {', '.join(ON_PROBLEM_CHOICES)}, "
                f"got {request.on_problem!r}"
            )
        script = None
        if request.module is None:
            if not args:
                raise NanHunterError("run needs a script (nan-hunter run train.py [ARGS]...) "
                                     "or -m MODULE")
            script = args.pop(0)
            if not Path(script).is_file():
                raise NanHunterError(f"no such script: {script}")
        project = discover(search_start([script] if script else []))
        settings = load_settings(
            request.config,
            {
                "policy": request.policy.value if request.policy else None,
                "dtype": request.dtype.value if request.dtype else None,
                "verify_fixes": request.verify,
            },
            project=project,
        )
        output = _absolute(None if str(request.output) == "-" else request.output)
        patch = _absolute(request.patch)
        if script is not None:
            refuse_overwrite(output, patch, {os.path.realpath(script): "the script"})
    except NanHunterError as exc:
        raise fail(str(exc)) from None
    given = frozenset(
        name for name, value in (("dtype", request.dtype),) if value is not None
    )
    job = RunJob(
        script=script, module=request.module, argv=tuple(args), settings=settings,
        on_problem=request.on_problem, max_steps=request.max_steps,
        output_format=request.output_format.value,
        output=str(output) if output else None, patch=str(patch) if patch else None,
        quiet=request.quiet, color=wants_color(ColorChoice.auto, sys.stderr),
        width=report_width(sys.stderr), precision_given=given,
    )
    command = [sys.executable, "-c", BOOT, str(Path(_HOME).parent), job.encode(), *args]
    raise typer.Exit(_wait(command))


def _absolute(path: Path | None) -> Path | None:
    return None if path is None else Path(os.path.abspath(path))


def _real_fd(stream: Any, fd: int) -> bool:
    try:
        return bool(stream.fileno() == fd)
    except (AttributeError, OSError, ValueError):
        return False


def _wait(command: list[str]) -> int:
    """Run ``command`` sharing our terminal; its exit code (128 + N for a signal N)."""
    relay = not (_real_fd(sys.stdout, 1) and _real_fd(sys.stderr, 2))
    pipe = subprocess.PIPE if relay else None
    child = subprocess.Popen(command, stdout=pipe, stderr=pipe)
    # ignored only now: an ignored SIGINT would be inherited, and the script could not get it
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if relay:
            assert child.stdout is not None and child.stderr is not None
            copies = [
                threading.Thread(target=_copy, args=(child.stdout, sys.stdout), daemon=True),
                threading.Thread(target=_copy, args=(child.stderr, sys.stderr), daemon=True),
            ]
            for copy in copies:
                copy.start()
            for copy in copies:
                copy.join()
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    if code < 0:
        if not relay and -code == signal.SIGINT:  # die of it too, as the shell expects
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        return 128 - code
    return code


def _copy(source: IO[bytes], target: Any) -> None:
    for line in iter(source.readline, b""):
        target.write(line.decode(errors="replace"))
        target.flush()
