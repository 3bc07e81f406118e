"""The command line: ``nan-hunter scan``, ``rules`` and ``explain``.

A thin typer layer: it parses options, calls the API, prints what the report emitters return and
maps outcomes to exit codes: 0 clean, 1 findings at or above ``--fail-on``, 2 usage, load or
internal errors (one line on stderr, no traceback unless ``NAN_HUNTER_DEBUG=1``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markdown import Markdown
from typer.core import TyperGroup

from nan_hunter.errors import NanHunterError, first_line
from nan_hunter.terminal import ColorChoice, quiet_torch_numpy_warning

quiet_torch_numpy_warning()  # before anything imports torch

if TYPE_CHECKING:
    from nan_hunter.config import Settings
    from nan_hunter.findings import Report
    from nan_hunter.fixes.workflow import Applied


class _OneLineErrors(TyperGroup):
    """Usage errors (unknown option, bad choice, out-of-range number) as one
    ``nan-hunter: error:`` line and exit 2, for every command: no usage boxes."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except _NO_ARGS as exc:
            typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            code = EXIT_ERROR
        except _clicks.ClickException as exc:
            typer.echo(f"nan-hunter: error: {_usage_message(exc)}", err=True)
            code = EXIT_ERROR
        except typer.Abort:
            code = 130
        if standalone_mode:
            sys.exit(code or 0)
        return code


try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as _clicks
except ImportError:  # pragma: no cover - older typer on click
    from click import exceptions as _clicks  # type: ignore[no-redef]
_NO_ARGS: Any = getattr(_clicks, "NoArgsIsHelpError", ())


def _usage_message(exc: Any) -> str:
    message = " ".join(exc.format_message().split()).rstrip(".").replace("Value error, ", "")
    message = message[:1].lower() + message[1:]
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "nan-hunter"
    return f"{message} (see `{command} --help`)"


app = typer.Typer(
    cls=_OneLineErrors,
    name="nan-hunter",
    help="Find where and why FP16 mixed precision breaks a PyTorch model, and get a patch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _show_version(value: bool) -> None:
    if value:
        from nan_hunter.version import __version__

        typer.echo(f"nan-hunter {__version__}")
        raise typer.Exit(EXIT_CLEAN)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """Find where and why FP16 mixed precision breaks a PyTorch model, and get a patch."""


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    sarif = "sarif"
    github = "github"
    junit = "junit"


class DType(str, Enum):
    float16 = "float16"
    bfloat16 = "bfloat16"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Policy(str, Enum):
    cuda = "cuda"
    cpu = "cpu"
    native = "native"


class Mode(str, Enum):
    autocast = "autocast"
    half = "half"


class Numerics(str, Enum):
    emulated = "emulated"
    real = "real"


class FailOn(str, Enum):
    error = "error"
    warning = "warning"


def _default(key: str, yes: str = "", no: str = "") -> str:
    """A setting's default for --help (the project's config or --config may change it)."""
    from nan_hunter.config import Settings

    value = getattr(Settings(), key)
    if isinstance(value, bool) and yes:
        value = yes if value else no
    elif isinstance(value, tuple):
        value = ",".join(value) or "none"
    elif value is None:
        value = "none"
    return f"  [default: {value}, unless configured]"


def _fail(message: str, output: str = "") -> typer.Exit:
    """One error line; then, for a failed scan process, what the model's code printed."""
    typer.echo(f"nan-hunter: error: {message}", err=True)
    if output:
        typer.echo(output, err=True, nl=False)
    return typer.Exit(EXIT_ERROR)


def _check_timeout(value: float | None) -> float | None:
    if value is not None and not 0 < value < float("inf"):
        raise typer.BadParameter(
            f"{value:g} is not a positive number of seconds", param_hint="'--timeout'"
        )
    return value


@app.command()
def scan(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Model files (paths or pkg.module), or folders: every .py file below that "
            "defines the model function.",
            show_default=False,
        ),
    ],
    model_fn: Annotated[
        str, typer.Option("--model-fn", help="Function that builds the model.")
    ] = "build_model",
    batch_fn: Annotated[
        str, typer.Option("--batch-fn", help="Function that returns a sample batch.")
    ] = "sample_batch",
    loss_fn: Annotated[
        str, typer.Option("--loss-fn", help="Optional loss function loss_fn(output, batch).")
    ] = "loss_fn",
    weights: Annotated[
        Path | None, typer.Option(help="state_dict to load (.pt via weights_only, .safetensors).")
    ] = None,
    batch_file: Annotated[
        Path | None, typer.Option("--batch-file", help="Saved batch to use instead of batch-fn.")
    ] = None,
    dtype: Annotated[
        DType | None, typer.Option(help="Low-precision dtype." + _default("dtype"))
    ] = None,
    device: Annotated[
        Device | None,
        typer.Option(help="auto = cuda when available." + _default("device")),
    ] = None,
    policy: Annotated[
        Policy | None,
        typer.Option(
            help="Autocast op lists to apply: cuda (also on a CPU), cpu, native."
            + _default("policy"),
        ),
    ] = None,
    mode: Annotated[
        Mode | None,
        typer.Option(
            help="autocast, or half: model and batch in FP16." + _default("mode")
        ),
    ] = None,
    numerics: Annotated[
        Numerics | None,
        typer.Option(
            help="On a CPU: emulated FP16 (fast) or real FP16 kernels (slow)."
            + _default("numerics"),
        ),
    ] = None,
    backward: Annotated[
        bool | None,
        typer.Option(
            "--backward/--no-backward",
            help="Also check the backward pass."
            + _default("backward", "backward", "no-backward"),
        ),
    ] = None,
    grad_scale: Annotated[
        str | None,
        typer.Option(
            "--grad-scale",
            help="Loss scale for the backward: dynamic (GradScaler's 2**16, backed off on "
            "overflow), a fixed scale (65536, 2**16) or none." + _default("grad_scale"),
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="YAML settings file; overrides the project's discovered settings."),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="Report format.")
    ] = OutputFormat.text,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the report to this file.")
    ] = None,
    patch: Annotated[
        Path | None, typer.Option(help="Write the suggested fixes as a unified diff here.")
    ] = None,
    select: Annotated[
        list[str] | None,
        typer.Option(
            help="Rule codes or prefixes to report (repeatable)." + _default("select")
        ),
    ] = None,
    ignore: Annotated[
        list[str] | None,
        typer.Option(
            help="Rule codes or prefixes to skip (repeatable)." + _default("ignore")
        ),
    ] = None,
    fail_on: Annotated[
        FailOn | None,
        typer.Option(
            "--fail-on", help="Lowest severity that exits 1." + _default("fail_on")
        ),
    ] = None,
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 even when there are findings.")
    ] = False,
    color: Annotated[
        ColorChoice,
        typer.Option(
            "--color",
            help="Colour the text report: auto follows NO_COLOR, FORCE_COLOR and the terminal.",
        ),
    ] = ColorChoice.auto,
    no_color: Annotated[
        bool, typer.Option("--no-color", help="Same as --color never.", show_default=False)
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress display on stderr.")
    ] = False,
    diff: Annotated[
        bool, typer.Option("--diff", help="Print the combined patch of the fixes, not the report.")
    ] = False,
    fix: Annotated[
        bool, typer.Option("--fix", help="Apply the verified fixes to the model file.")
    ] = False,
    unsafe_fixes: Annotated[
        bool, typer.Option("--unsafe-fixes", help="Include fixes marked unsafe.")
    ] = False,
    fix_all: Annotated[
        bool,
        typer.Option("--fix-all", help="Fix and re-scan until clean or --rounds rounds."),
    ] = False,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds for --fix-all.")] = 5,
    backup: Annotated[
        bool, typer.Option("--backup/--no-backup", help="Keep FILE.orig when fixing.")
    ] = True,
    verify: Annotated[
        bool | None,
        typer.Option(
            "--verify/--no-verify",
            help="Re-scan a patched copy to prove each fix."
            + _default("verify_fixes", "verify", "no-verify"),
        ),
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option(
            "--lr", help="Adam learning rate for --steps." + _default("lr")
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps",
            min=1,
            help="Train a copy for up to N Adam steps on the sample batch; scan the first step "
            "that breaks.",
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            callback=_check_timeout,
            help="Stop the scan process of a model file after this many seconds (exit 2). "
            "Default: no limit.",
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of an internal error.")
    ] = False,
) -> None:
    """Scan a model under FP16 autocast: first failing op, FP32 verdict and a patch."""
    from nan_hunter.config import load_settings
    from nan_hunter.discovery import discover, search_start
    from nan_hunter.fixes.edits import render_diff, render_patch
    from nan_hunter.fixes.select import select_fixes
    from nan_hunter.isolation import run_isolated
    from nan_hunter.project import project_root
    from nan_hunter.targets import expand_paths
    from nan_hunter.terminal import progress_display, report_width, wants_color

    debug = debug or bool(os.environ.get("NAN_HUNTER_DEBUG"))
    # Resolved now, against the folder nan-hunter was started in: the model's code may chdir.
    output, patch = _absolute(output), _absolute(patch)
    try:
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
                "verify_fixes": verify,
                "lr": lr,
            },
            project=discover(search_start(paths)),
        )
        if steps is not None and (fix or fix_all):
            raise NanHunterError("--steps cannot be combined with --fix or --fix-all")
        files = expand_paths(paths, model_fn)
        if len(files) > 1 and (diff or patch is not None):
            raise NanHunterError("--diff and --patch take one model file, not several")
        inputs = _inputs(files, weights, batch_file, config)
        _refuse_overwrite(output, patch, inputs)
    except NanHunterError as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:  # a bug of ours: say so in one line
        if debug:
            raise
        raise _fail(_internal(exc)) from None

    def scan_one(path: str) -> Report:
        """The report of one model file, from its own scan process (``nan_hunter.isolation``)."""
        job = ScanJob(
            path, settings, (model_fn, batch_fn, loss_fn), weights, batch_file, steps, fix,
            fix_all, rounds, unsafe_fixes, backup,
        )
        isolated = run_isolated(_scan_job, job, timeout=timeout, debug=debug, on_step=shown.step)
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
                    raise _fail(str(exc), output_text) from None
                typer.echo(f"nan-hunter: error: {path}: {exc}", err=True)
                typer.echo(output_text, err=True, nl=False)
                failed.append(Failed(path, str(exc)))
            except Exception as exc:  # a bug of ours: say so in one line
                if debug:
                    raise
                message = _internal(exc)
                if len(files) == 1:
                    raise _fail(message) from None
                typer.echo(f"nan-hunter: error: {path}: {message}", err=True)
                failed.append(Failed(path, message))
            shown.file_done()

    from nan_hunter.report import render
    from nan_hunter.report.combined import render_many

    try:  # nothing written over a file the scan imported (the model's package, its siblings)
        _refuse_overwrite(output, patch, inputs)
    except NanHunterError as exc:
        raise _fail(str(exc)) from None

    use_color = wants_color(ColorChoice.never if no_color else color, sys.stdout)
    width = report_width(sys.stdout)
    if len(files) > 1:
        text = render_many(
            reports, failed, output_format.value, color=use_color and output is None, width=width
        )
        _emit(text, output, color=use_color)
        codes = [r.exit_code(settings.fail_on) for r in reports] + [EXIT_ERROR] * bool(failed)
        raise typer.Exit(EXIT_CLEAN if exit_zero and not failed else max(codes))
    report = reports[0]
    selection = select_fixes(report, unsafe=unsafe_fixes)
    root = project_root(Path(report.target.file))
    if diff:
        typer.echo(render_diff(selection.edits, root), nl=False)
        code = report.exit_code(settings.fail_on)
        raise typer.Exit(EXIT_CLEAN if exit_zero else code)
    text = render(report, output_format.value, color=use_color and output is None, width=width)
    _emit(text, output, color=use_color)
    if patch is not None:
        if selection.edits:
            _write(patch, render_patch(selection.edits, root))
            typer.echo(f"nan-hunter: patch written to {patch}", err=True)
        else:
            typer.echo("nan-hunter: no patch to write: no finding has a fix to apply", err=True)
    code = report.exit_code(settings.fail_on)
    raise typer.Exit(EXIT_CLEAN if exit_zero else code)


def _say_applied(applied: list[Applied] | tuple[Applied, ...], prefix: str) -> None:
    for a in applied:
        if a.fixed:
            kept = f" (original kept as {a.backup.name})" if a.backup else ""
            codes = ", ".join(f.code for f in a.fixed)
            typer.echo(f"nan-hunter: {prefix}fixed {codes} in {a.file}{kept}", err=True)
        for f, why in a.skipped:
            typer.echo(f"nan-hunter: {prefix}not fixed: {f.code} ({why})", err=True)


def _internal(exc: BaseException) -> str:
    """One line, even for an exception whose ``__str__`` raises."""
    try:
        summary = f"{type(exc).__name__}: {first_line(exc)}"
    except Exception:
        summary = type(exc).__name__
    return f"internal error: {summary} (use --debug for a traceback)"


@dataclass(frozen=True)
class ScanJob:
    """What one model file's scan runs in its scan process (see ``nan_hunter.isolation``)."""

    path: str
    settings: Settings
    names: tuple[str, str, str]
    """``--model-fn``, ``--batch-fn``, ``--loss-fn``."""
    weights: Path | None
    batch_file: Path | None
    steps: int | None
    fix: bool
    fix_all: bool
    rounds: int
    unsafe_fixes: bool
    backup: bool


def _scan_job(job: ScanJob) -> Report:
    """The report of one model file, after --steps, --fix-all, verification and --fix: the part
    of ``scan`` that runs the user's code."""
    from nan_hunter.api import scan_file
    from nan_hunter.fixes.workflow import apply_fixes
    from nan_hunter.fixes.workflow import fix_all as run_fix_all
    from nan_hunter.loader import Names, load_target, model_folder
    from nan_hunter.suppressions import apply_suppressions
    from nan_hunter.training import run_steps

    path, settings, names, weights, batch_file = (
        job.path, job.settings, Names(*job.names), job.weights, job.batch_file
    )
    steps, fix, fix_all, rounds, unsafe_fixes, backup = (
        job.steps, job.fix, job.fix_all, job.rounds, job.unsafe_fixes, job.backup
    )
    # scan_file verifies each fix (nan_hunter.fixes.verify); --fix and --fix-all need it
    verifying = settings.verify_fixes or fix or fix_all

    def rescan(file: Path) -> Report:
        return scan_file(
            str(file), settings, names=names, weights=weights, batch_file=batch_file,
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
            typer.echo(f"nan-hunter: trained {result.steps_run} step(s); {where}", err=True)
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
                typer.echo(f"nan-hunter: --fix-all stopped: {outcome.stopped}", err=True)
            report = outcome.report
        if fix and not fix_all:
            applied = apply_fixes(report, unsafe=unsafe_fixes, backup=backup)
            _say_applied(applied, "")
            if any(a.fixed for a in applied):
                report = rescan(Path(report.target.file))
    return report


def _absolute(path: Path | None) -> Path | None:
    return None if path is None else Path(os.path.abspath(path))


def _inputs(
    specs: list[str], weights: Path | None, batch_file: Path | None, config: Path | None
) -> dict[str, str]:
    """Real path -> what it is, for every file the scan reads that we know of before it runs."""
    named: list[tuple[str, Path | None]] = [
        ("the model file", Path(s)) for s in specs if s.endswith(".py") or Path(s).exists()
    ]
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


def _emit(text: str, output: Path | None, *, color: bool = False) -> None:
    if output is not None:
        _write(output, text)
        typer.echo(f"nan-hunter: report written to {output}", err=True)
    else:  # color=True: click would strip the colour codes from a pipe otherwise
        typer.echo(text, nl=False, color=color or None)


def _write(path: Path, text: str | bytes) -> None:
    from nan_hunter.safe_write import write_file

    try:
        write_file(path, text)
    except NanHunterError as exc:
        raise _fail(str(exc)) from None


@app.command()
def rules() -> None:
    """List every rule code with its name and summary."""
    from nan_hunter.report.text import render_rules
    from nan_hunter.rules import all_rules
    from nan_hunter.terminal import report_width

    typer.echo(render_rules(all_rules(), width=report_width(sys.stdout)), nl=False)


@app.command("config")
def show_config(
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Paths as given to scan: the search for the project's settings starts in their "
            "folder.  [default: the working directory]",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="YAML settings file, as for scan.", show_default=False)
    ] = None,
) -> None:
    """Show the effective settings and where each came from (as YAML)."""
    from nan_hunter.config import load_settings
    from nan_hunter.discovery import describe, discover, search_start

    try:
        project = discover(search_start(paths or []))
        settings = load_settings(config, project=project)
    except NanHunterError as exc:
        raise _fail(str(exc)) from None
    typer.echo(describe(settings, project), nl=False)


@app.command()
def explain(code: Annotated[str, typer.Argument(help="A rule code, e.g. NH101.")]) -> None:
    """Show a rule's documentation: What, Why, Example, Fix."""
    from nan_hunter.rules import get_rule

    rule = get_rule(code)
    if rule is None:
        raise _fail(f"unknown rule code {code!r}; `nan-hunter rules` lists them")
    console = Console(highlight=False)
    console.print(Markdown(f"# {rule.code} {rule.name}\n\n{rule.summary}\n\n{rule.doc}"))


def main() -> None:
    app(prog_name="nan-hunter")
