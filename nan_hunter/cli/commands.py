"""The command line: ``nan-hunter scan``, ``run``, ``rules``, ``config`` and ``explain``.

A thin typer layer: each command parses its options (declared in ``nan_hunter.cli.options``),
calls the layer below and prints what comes back. What ``scan`` does lives in
``nan_hunter.cli.scan_command``; exit codes: 0 clean, 1 findings at or above ``--fail-on``, 2 usage,
load or internal errors (one line on stderr, no traceback unless ``NAN_HUNTER_DEBUG=1``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from nan_hunter.cli import options as o
from nan_hunter.cli.options import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, OneLineErrors
from nan_hunter.cli.output import fail
from nan_hunter.cli.scan_command import ScanCommand, run_scan
from nan_hunter.cli.terminal import ColorChoice
from nan_hunter.errors import NanHunterError
from nan_hunter.process.scan_process import ScanJob
from nan_hunter.process.worker import quiet_torch_numpy_warning
from nan_hunter.project.choices import OutputFormat

quiet_torch_numpy_warning()  # before anything imports torch

__all__ = ["EXIT_CLEAN", "EXIT_ERROR", "EXIT_FINDINGS", "OutputFormat", "ScanJob", "app", "main"]

app = typer.Typer(
    cls=OneLineErrors,
    name="nan-hunter",
    help="Find where and why FP16 mixed precision breaks a PyTorch model, and get a patch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)


@app.callback()
def _root(version: o.Version = False) -> None:
    """Find where and why FP16 mixed precision breaks a PyTorch model, and get a patch."""


@app.command()
def scan(
    paths: o.Paths,
    model_fn: o.ModelFn = "build_model",
    batch_fn: o.BatchFn = "sample_batch",
    loss_fn: o.LossFn = "loss_fn",
    weights: o.Weights = None,
    batch_file: o.BatchFile = None,
    dtype: o.Dtype = None,
    device: o.Device = None,
    policy: o.Policy = None,
    mode: o.Mode = None,
    numerics: o.Numerics = None,
    backward: o.Backward = None,
    grad_scale: o.GradScale = None,
    config: o.Config = None,
    output_format: o.OutputFormat = OutputFormat.text,
    output: o.Output = None,
    patch: o.Patch = None,
    select: o.Select = None,
    ignore: o.Ignore = None,
    fail_on: o.FailOn = None,
    min_headroom: o.MinHeadroom = None,
    precision_check: o.PrecisionCheck = None,
    range_map: o.RangeMap = False,
    exit_zero: o.ExitZero = False,
    color: o.Color = ColorChoice.auto,
    no_color: o.NoColor = False,
    quiet: o.Quiet = False,
    diff: o.Diff = False,
    fix: o.Fix = False,
    unsafe_fixes: o.UnsafeFixes = False,
    fix_all: o.FixAll = False,
    rounds: o.Rounds = 5,
    backup: o.Backup = True,
    verify: o.Verify = None,
    lr: o.Lr = None,
    steps: o.Steps = None,
    timeout: o.Timeout = None,
    debug: o.Debug = False,
) -> None:
    """Scan a model under FP16 autocast: first failing op, FP32 verdict and a patch."""
    run_scan(ScanCommand.partition(locals()))


@app.command(
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True}
)
def run(
    args: o.RunArgs = None,
    module: o.RunModule = None,
    on_problem: o.OnProblem = "stop",
    max_steps: o.MaxSteps = None,
    policy: o.Policy = None,
    dtype: o.RunDtype = None,
    config: o.Config = None,
    output_format: o.OutputFormat = OutputFormat.text,
    output: o.Output = None,
    patch: o.Patch = None,
    verify: o.Verify = None,
    quiet: o.Quiet = False,
    save_repro: o.SaveRepro = None,
    no_save_repro: o.NoSaveRepro = False,
    repro_max_mb: o.ReproMaxMb = 512,
    spike_factor: o.SpikeFactor = 10.0,
    spike_window: o.SpikeWindow = 50,
    spike_warmup: o.SpikeWarmup = 10,
    spikes_are_problems: o.SpikesAreProblems = False,
    forecast_every: o.ForecastEvery = 50,
    stop_before_overflow: o.StopBeforeOverflow = False,
) -> None:
    """Run a training script unmodified; re-run and report its first step that breaks."""
    request = {**locals(), "args": args or []}
    from nan_hunter.cli.run_command import RunRequest, run_script

    run_script(RunRequest(**request))


@app.command()
def rules() -> None:
    """List every rule code with its name and summary."""
    from nan_hunter.cli.terminal import report_width
    from nan_hunter.report.catalog import rule_catalog
    from nan_hunter.report.text import render_rules

    typer.echo(render_rules(rule_catalog(), width=report_width(sys.stdout)), nl=False)


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
    from nan_hunter.project.config import load_settings
    from nan_hunter.project.discovery import describe, discover, search_start

    try:
        project = discover(search_start(paths or []))
        settings = load_settings(config, project=project)
    except NanHunterError as exc:
        raise fail(str(exc)) from None
    typer.echo(describe(settings, project), nl=False)


@app.command()
def explain(code: Annotated[str, typer.Argument(help="A rule code, e.g. NH101.")]) -> None:
    """Show a rule's documentation: What, Why, Example, Fix."""
    from rich.markdown import Markdown  # markdown-it and pygments: only this command

    from nan_hunter.report.catalog import rule_catalog

    rule = next((r for r in rule_catalog() if r.code == code.upper()), None)
    if rule is None:
        raise fail(f"unknown rule code {code!r}; `nan-hunter rules` lists them")
    console = Console(highlight=False)
    console.print(Markdown(f"# {rule.code} {rule.name}\n\n{rule.summary}\n\n{rule.doc}"))


def main() -> None:
    app(prog_name="nan-hunter")
