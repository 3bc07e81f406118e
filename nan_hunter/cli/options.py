"""The command line's declarations, apart from its commands: the options of ``nan-hunter scan``
as annotated types (typer reads them), and usage errors as one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from nan_hunter.cli.terminal import ColorChoice
from nan_hunter.core.untrusted import echoed
from nan_hunter.project import choices

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class OneLineErrors(TyperGroup):
    """Usage errors (unknown option, bad choice, out-of-range number) as one
    ``nan-hunter: error:`` line and exit 2, for every command: no usage boxes."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except _NO_ARGS as exc:
            typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            code = EXIT_ERROR
        except _clicks.ClickException as exc:
            typer.echo(f"nan-hunter: error: {echoed(_usage_message(exc))}", err=True)
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


def _show_version(value: bool) -> None:
    if value:
        from nan_hunter.version import __version__

        typer.echo(f"nan-hunter {__version__}")
        raise typer.Exit(EXIT_CLEAN)


Version = Annotated[
    bool,
    typer.Option(
        "--version", callback=_show_version, is_eager=True, help="Show the version and exit."
    ),
]


def _default(key: str, yes: str = "", no: str = "") -> str:
    """A setting's default for --help (the project's config or --config may change it)."""
    from nan_hunter.project.config import Settings

    value = getattr(Settings(), key)
    if isinstance(value, bool) and yes:
        value = yes if value else no
    elif isinstance(value, tuple):
        value = ",".join(value) or "none"
    elif value is None:
        value = "none"
    return f"  [default: {value}, unless configured]"


def _check_timeout(value: float | None) -> float | None:
    if value is not None and not 0 < value < float("inf"):
        raise typer.BadParameter(
            f"{value:g} is not a positive number of seconds", param_hint="'--timeout'"
        )
    return value


Paths = Annotated[
    list[str],
    typer.Argument(
        help="Model files (paths or pkg.module), or folders: every .py file below that "
        "defines the model function.",
        show_default=False,
    ),
]
ModelFn = Annotated[str, typer.Option("--model-fn", help="Function that builds the model.")]
BatchFn = Annotated[str, typer.Option("--batch-fn", help="Function that returns a sample batch.")]
LossFn = Annotated[
    str, typer.Option("--loss-fn", help="Optional loss function loss_fn(output, batch).")
]
Weights = Annotated[
    Path | None, typer.Option(help="state_dict to load (.pt via weights_only, .safetensors).")
]
BatchFile = Annotated[
    Path | None, typer.Option("--batch-file", help="Saved batch to use instead of batch-fn.")
]
Dtype = Annotated[
    choices.DType | None,
    typer.Option(
        help="Dtype to analyse in: float16, bfloat16, or float32 (a plain FP32 run)."
        + _default("dtype")
    ),
]
Device = Annotated[
    choices.Device | None,
    typer.Option(help="auto = cuda when available." + _default("device")),
]
Policy = Annotated[
    choices.Policy | None,
    typer.Option(
        help="Autocast op lists to apply: cuda (also on a CPU), cpu, native." + _default("policy"),
    ),
]
Mode = Annotated[
    choices.Mode | None,
    typer.Option(help="autocast, or half: model and batch in FP16." + _default("mode")),
]
Numerics = Annotated[
    choices.Numerics | None,
    typer.Option(
        help="On a CPU: emulated FP16 (fast) or real FP16 kernels (slow)." + _default("numerics"),
    ),
]
Backward = Annotated[
    bool | None,
    typer.Option(
        "--backward/--no-backward",
        help="Also check the backward pass." + _default("backward", "backward", "no-backward"),
    ),
]
GradScale = Annotated[
    str | None,
    typer.Option(
        "--grad-scale",
        help="Loss scale for the backward: dynamic (GradScaler's 2**16, backed off on "
        "overflow), a fixed scale (65536, 2**16) or none." + _default("grad_scale"),
    ),
]
Config = Annotated[
    Path | None,
    typer.Option(help="YAML settings file; overrides the project's discovered settings."),
]
OutputFormat = Annotated[choices.OutputFormat, typer.Option("--format", help="Report format.")]
Output = Annotated[
    Path | None, typer.Option("--output", "-o", help="Write the report to this file ('-': stdout).")
]
Patch = Annotated[
    Path | None, typer.Option(help="Write the suggested fixes as a unified diff here.")
]
Select = Annotated[
    list[str] | None,
    typer.Option(help="Rule codes or prefixes to report (repeatable)." + _default("select")),
]
Ignore = Annotated[
    list[str] | None,
    typer.Option(help="Rule codes or prefixes to skip (repeatable)." + _default("ignore")),
]
FailOn = Annotated[
    choices.FailOn | None,
    typer.Option("--fail-on", help="Lowest severity that exits 1." + _default("fail_on")),
]
MinHeadroom = Annotated[
    float | None,
    typer.Option(
        "--min-headroom",
        min=0,
        help="Warn (NH503) about a forward value within this factor of the FP16 maximum "
        "(8: |x| > 8188); 0: off." + _default("min_headroom"),
    ),
]
PrecisionCheck = Annotated[
    choices.PrecisionCheck | None,
    typer.Option(
        "--precision-check",
        help="Compare every op, the loss and the gradients with an FP32 run (NH6xx): auto "
        "(with bfloat16 only), on, off." + _default("precision_check"),
    ),
]
RangeMap = Annotated[
    bool,
    typer.Option(
        "--range-map",
        help="Text report: list every module's range and headroom, not only the 5 ops "
        "closest to the limits.",
    ),
]
ExitZero = Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even when there are findings.")]
Color = Annotated[
    ColorChoice,
    typer.Option(
        "--color",
        help="Colour the text report: auto follows NO_COLOR, FORCE_COLOR and the terminal.",
    ),
]
NoColor = Annotated[
    bool, typer.Option("--no-color", help="Same as --color never.", show_default=False)
]
Quiet = Annotated[bool, typer.Option(
    "--quiet", "-q",
    help="No progress display, and no 'report written to' or 'patch written to' note, on stderr.",
)]
Diff = Annotated[
    bool, typer.Option("--diff", help="Print the combined patch of the fixes, not the report.")
]
Fix = Annotated[bool, typer.Option("--fix", help="Apply the verified fixes to the model file.")]
UnsafeFixes = Annotated[bool, typer.Option("--unsafe-fixes", help="Include fixes marked unsafe.")]
FixAll = Annotated[
    bool,
    typer.Option("--fix-all", help="Fix and re-scan until clean or --rounds rounds."),
]
Rounds = Annotated[int, typer.Option(min=1, help="Rounds for --fix-all.")]
Backup = Annotated[bool, typer.Option("--backup/--no-backup", help="Keep FILE.orig when fixing.")]
Verify = Annotated[
    bool | None,
    typer.Option(
        "--verify/--no-verify",
        help="Re-scan a patched copy to prove each fix."
        + _default("verify_fixes", "verify", "no-verify"),
    ),
]
Lr = Annotated[
    float | None,
    typer.Option("--lr", help="Adam learning rate for --steps." + _default("lr")),
]
Steps = Annotated[
    int | None,
    typer.Option(
        "--steps",
        min=1,
        help="Train a copy for up to N Adam steps on the sample batch; scan the first step "
        "that breaks.",
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        callback=_check_timeout,
        help="Stop the scan process of a model file after this many seconds (exit 2). "
        "Default: no limit.",
    ),
]
Debug = Annotated[bool, typer.Option("--debug", help="Show the traceback of an internal error.")]

# --- nan-hunter run --------------------------------------------------------------------------
RunArgs = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="SCRIPT [ARGS]...",
        help="The training script and its own arguments, as for python (with -m: only the "
        "arguments, after --).",
        show_default=False,
    ),
]
RunModule = Annotated[
    str | None,
    typer.Option("-m", "--module", help="Run a module as python -m does.", show_default=False),
]
OnProblem = Annotated[
    str,
    typer.Option(
        "--on-problem",
        help="At the first bad step, after the report: stop (exit 1), continue (the update "
        "skipped) or raise TrainingProblem in the script.",
    ),
]
MaxSteps = Annotated[
    int | None,
    typer.Option(
        "--max-steps", min=1,
        help="End the script after N optimizer steps (exit 0 when none broke): a CI smoke run.",
    ),
]
RunDtype = Annotated[
    choices.DType | None,
    typer.Option(help="Dtype of the re-run.  [default: the one the step ran in]"),
]
SaveRepro = Annotated[
    Path | None,
    typer.Option(
        "--save-repro", metavar="DIR",
        help="Save the problem step's reproduction bundle (weights, inputs, output gradients, "
        "RNG, a model.py for nan-hunter scan) into DIR, a new or empty folder.  [default: a new "
        "nan-hunter-repro-stepN folder in the working directory]",
        show_default=False,
    ),
]
NoSaveRepro = Annotated[
    bool, typer.Option("--no-save-repro", help="Save no reproduction bundle.")
]
ReproMaxMb = Annotated[
    float,
    typer.Option(
        "--repro-max-mb", min=0,
        help="The most a reproduction bundle may hold, in MB (2**20 bytes): a larger one is "
        "not written.",
    ),
]
SpikeFactor = Annotated[
    float,
    typer.Option(
        "--spike-factor",
        help="A loss above this many times the median of the recent ones is a spike (a warning "
        "line); 0 turns the spike check off.",
    ),
]
SpikeWindow = Annotated[
    int, typer.Option("--spike-window", min=1, help="Recent losses whose median a loss is "
                      "compared with.")
]
SpikeWarmup = Annotated[
    int, typer.Option("--spike-warmup", min=1, help="Losses seen before any is judged a spike.")
]
ForecastEvery = Annotated[
    int,
    typer.Option(
        "--forecast-every", min=0,
        help="Sample the range map (each module's max |x|) every N optimizer steps and warn "
        "when its trend reaches the format's limit within the run; 0 turns it off.",
    ),
]
StopBeforeOverflow = Annotated[
    bool,
    typer.Option(
        "--stop-before-overflow",
        help="An overflow the forecast puts before the next sample is a problem step (report, "
        "re-run, --on-problem) while every value is still finite.",
    ),
]
SpikesAreProblems = Annotated[
    bool,
    typer.Option(
        "--spikes-are-problems",
        help="A loss spike is a problem step (report, re-run, --on-problem), not a warning.",
    ),
]
