"""What ``nan-hunter run`` does below its typer declaration, in the command line's own
(torch-free) process: check the arguments, build the settings of the re-run, start the script's
process (``process/script_process.py``) and exit with its exit code.

The script's process shares our terminal: its stdin, stdout and stderr are ours, and Ctrl-C
reaches it directly (we ignore SIGINT while it runs, and die of the signal that ended it). The
signals a launcher sends to the process it started (SIGTERM, SIGHUP, SIGUSR1, SIGUSR2) are
passed on to the script, and we exit as it exits. SIGINT is not passed on: Ctrl-C reaches the
script by itself, and a second copy would interrupt its clean-up. When our stdout or
stderr is not a real file (a test's ``CliRunner``), its output is copied into them.

The exit code is 1 whenever the script's process reported a problem step (it says so in a
status file before the report is written), whatever the script did after: ``os._exit(0)``, a
swallowed stop, a signal; 2 when it refused to write a file and found no problem; else the
script's own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import typer

from nan_hunter.cli.options import EXIT_ERROR
from nan_hunter.cli.output import fail
from nan_hunter.cli.terminal import ColorChoice
from nan_hunter.core.spikes import SpikeRule
from nan_hunter.errors import NanHunterError
from nan_hunter.process.script_process import _HOME, BOOT, EXIT_PROBLEM, ON_PROBLEM_CHOICES, RunJob
from nan_hunter.project.choices import DType, OutputFormat, Policy


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
    save_repro: Path | None = None
    no_save_repro: bool = False
    repro_max_mb: float = 512
    spike_factor: float = 10.0
    spike_window: int = 50
    spike_warmup: int = 10
    spikes_are_problems: bool = False
    forecast_every: int = 50
    stop_before_overflow: bool = False


def run_script(request: RunRequest) -> None:
    """Run the script; always ends in ``typer.Exit`` with the script's process's exit code."""
    from nan_hunter.cli.terminal import report_width, wants_color
    from nan_hunter.core.safe_write import refuse_overwrite
    from nan_hunter.project.config import DEFAULT_CONFIG, load_settings
    from nan_hunter.project.discovery import discover, search_start

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
            if Path(script).is_dir() and not (Path(script) / "__main__.py").is_file():
                raise NanHunterError(f"{script} is a folder without __main__.py: nothing to run")
            if not Path(script).exists():
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
        protected = _read_before(script, request.config, [
            DEFAULT_CONFIG, *([project.path] if project is not None else [])
        ])
        refuse_overwrite(output, patch, protected)
        repro = _repro_folder(request)
        spikes = _spike_rule(request)
        if request.stop_before_overflow and request.forecast_every == 0:
            raise NanHunterError("--stop-before-overflow needs the forecast (--forecast-every "
                                 "above 0)")
    except NanHunterError as exc:
        raise fail(str(exc)) from None
    given = frozenset(
        name for name, value in (("dtype", request.dtype),) if value is not None
    )
    with tempfile.TemporaryDirectory(prefix="nan-hunter-run-") as folder:
        status = os.path.join(folder, "status")
        job = RunJob(
            script=script, module=request.module, argv=tuple(args), settings=settings,
            on_problem=request.on_problem, max_steps=request.max_steps,
            output_format=request.output_format.value,
            output=str(output) if output else None, patch=str(patch) if patch else None,
            quiet=request.quiet, color=wants_color(ColorChoice.auto, sys.stderr),
            width=report_width(sys.stderr), precision_given=given,
            protected=tuple(protected.items()), status_file=status,
            repro=not request.no_save_repro, repro_folder=repro,
            repro_max_mb=request.repro_max_mb, spikes=spikes,
            spikes_are_problems=request.spikes_are_problems,
            forecast_every=request.forecast_every,
            stop_before_overflow=request.stop_before_overflow,
        )
        command = [sys.executable, "-c", BOOT, str(Path(_HOME).parent), job.encode(), *args]
        code = _wait(command)
        said = _read_status(status)
    if "problem" in said and code != 128 + signal.SIGINT:  # Ctrl-C: die of it, as before
        code = EXIT_PROBLEM
    elif "refused" in said and code == 0:
        code = EXIT_ERROR
    raise typer.Exit(code)


def _repro_folder(request: RunRequest) -> str | None:
    """``--save-repro DIR`` as an absolute path, refused now when DIR holds something (the
    bundle is never written over anything) or comes with ``--no-save-repro``."""
    folder = _absolute(request.save_repro)
    if folder is None:
        return None
    if request.no_save_repro:
        raise NanHunterError("--save-repro and --no-save-repro contradict each other")
    if folder.is_symlink() or (folder.exists() and (not folder.is_dir() or any(folder.iterdir()))):
        raise NanHunterError(f"--save-repro {request.save_repro}: it exists and is not an empty "
                             "folder; choose a new one")
    return str(folder)


def _spike_rule(request: RunRequest) -> SpikeRule | None:
    """The spike rule, None when ``--spike-factor 0`` turned it off."""
    if request.spike_factor == 0:
        if request.spikes_are_problems:
            raise NanHunterError("--spikes-are-problems needs the spike check (--spike-factor "
                                 "above 1)")
        return None
    return SpikeRule(request.spike_factor, request.spike_window, request.spike_warmup)


def _read_before(
    script: str | None, config: Path | None, settings_files: list[Path]
) -> dict[str, str]:
    """Real path -> what it is, for the files ``run`` reads that are known before the script
    starts; those the script imports or opens are added in its process (``ScriptFiles``)."""
    named: list[tuple[str, Path | None]] = [
        ("a settings file the run read", p) for p in settings_files
    ]
    if script is not None:
        main = Path(script) / "__main__.py" if Path(script).is_dir() else Path(script)
        named.append(("the script", main))
    named.append(("the --config file", config))
    return {os.path.realpath(p): what for what, p in named if p is not None}


def _read_status(path: str) -> set[str]:
    try:
        with open(path, encoding="utf-8") as status:
            return set(status.read().split())
    except OSError:
        return set()


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
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    for number in _FORWARDED:
        previous[number] = signal.signal(number, _forward_to(child))
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
        for number, handler in previous.items():
            signal.signal(number, handler)
    if code < 0:
        if not relay and -code == signal.SIGINT:  # die of it too, as the shell expects
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        return 128 - code
    return code


_FORWARDED = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)
"""What a launcher (a container's PID 1, a scheduler, torchrun) sends the process it started
to stop it or to ask for a checkpoint: the script must get it, not only nan-hunter."""


def _forward_to(child: subprocess.Popen[bytes]) -> Any:
    """A handler passing the signal on to ``child`` while it runs."""

    def forward(number: int, _frame: Any) -> None:
        if child.poll() is None:
            with contextlib.suppress(OSError):
                child.send_signal(number)

    return forward


def _copy(source: IO[bytes], target: Any) -> None:
    for line in iter(source.readline, b""):
        target.write(line.decode(errors="replace"))
        target.flush()
