"""The terminal report (rich): culprit first, with code, stats, FP32 verdict, fix and diff."""

from __future__ import annotations

from io import StringIO

from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax

from nan_hunter.findings import Finding, Phase, Report, ScanTarget, Severity
from nan_hunter.precision.formats import FloatFormat, format_for
from nan_hunter.precision.gradients import scale_advice
from nan_hunter.report.paths import display_path
from nan_hunter.trace.stats import format_number

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def render_text(report: Report, *, color: bool = False, width: int = 100) -> str:
    buffer = StringIO()
    console = Console(
        file=buffer,
        width=width,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )
    t = report.target
    console.print(
        f"[bold]nan-hunter[/] {escape(display_path(t.file))}: {t.mode} {t.dtype} on {t.device} "
        f"(policy {t.policy})"
    )
    for note in t.notes:
        console.print(f"  [dim]note[/]  {escape(note)}")
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    warnings = [f for f in report.findings if f.severity is not Severity.ERROR]
    for finding in errors:
        console.print()
        _finding(console, finding, detailed=True)
    if warnings:
        console.print()
        console.print(f"[bold]warnings[/] ({report.warnings})")
        for finding in warnings:
            _finding(console, finding, detailed=False)
    console.print()
    if report.loss_scale is not None and any(f.phase is Phase.BACKWARD for f in report.findings):
        console.print(f"[bold]loss scale[/]: {escape(scale_advice(report.loss_scale, _fmt(t)))}")
    console.print(_summary(report))
    return buffer.getvalue()


def _fmt(target: ScanTarget) -> FloatFormat:
    return format_for(target.dtype)


def _finding(console: Console, f: Finding, *, detailed: bool) -> None:
    style = _STYLE[f.severity]
    console.print(
        f"[{style}]{f.severity.value}[{f.code}][/] [bold]{f.kind.value}[/]: {escape(f.message)}"
    )
    if f.location is not None:
        console.print(f"  [blue]-->[/] {escape(display_path(f.location.file))}:{f.location.line}")
        console.print(f"   [blue]|[/]  {escape(f.location.code)}")
    if not detailed:
        return
    rows: list[tuple[str, str]] = []
    if f.op:
        phase = " (backward)" if f.phase is Phase.BACKWARD else ""
        rows.append(("op", f"{f.op}{phase}"))
        rows.append(("module", f.module or "(root)"))
    in_label, out_label = ("grad in", "grad out") if f.phase is Phase.BACKWARD else ("in", "out")
    for i, stats in enumerate(f.inputs):
        rows.append((f"{in_label}[{i}]", stats.render()))
    for i, stats in enumerate(f.outputs):
        rows.append((f"{out_label}[{i}]", stats.render()))
    if f.fp32_rerun is not None:
        rows.append(("fp32", verdict_sentence(f)))
    if f.upstream is not None:
        where = f.upstream.location
        at = f" at {display_path(where.file)}:{where.line}" if where else ""
        code = f"  {where.code}" if where else ""
        rows.append(("cause", f"{f.upstream.op}{at}{code}"))
    if f.fix is not None:
        rows.append(("fix", f"{f.fix.title} [{_fix_status(f)}]"))
        if f.fix.verified is not None and f.fix.remaining:
            rows.append(("after fix", "; ".join(f.fix.remaining)))
    rows.extend(("also", note) for note in f.notes)
    label_width = max((len(label) for label, _ in rows), default=0)
    for label, value in rows:
        console.print(f"  [dim]{label.ljust(label_width)}[/]  {escape(value)}")
    if f.fix is not None and f.fix.diff:
        console.print(Syntax(f.fix.diff.rstrip("\n"), "diff", theme="ansi_dark",
                             background_color="default"))


def _fix_status(f: Finding) -> str:
    fix = f.fix
    assert fix is not None
    status = fix.applicability.value
    if fix.verified is True:
        return f"{status}, verified by re-scan"
    if fix.verified is False:
        return f"{status}, NOT verified: the re-scan still has it"
    if fix.diff is None:
        return f"{status}, advice only"
    return f"{status}, not verified"


def verdict_sentence(f: Finding) -> str:
    rerun = f.fp32_rerun
    assert rerun is not None
    reach = f", |x| <= {format_number(rerun.abs_max)}" if rerun.abs_max is not None else ""
    if not rerun.finite:
        return f"non-finite in FP32 too{reach}: a real bug, not a precision problem"
    own = ""
    if rerun.own_inputs_finite is False:
        own = "; non-finite even in FP32 on its own low-precision inputs: the cause is upstream"
    return f"finite in FP32{reach}: a precision problem{own}"


def _summary(report: Report) -> str:
    origins = sum(1 for f in report.findings if f.origin and f.severity is Severity.ERROR)
    status = "[bold green]clean[/]" if not report.findings else "[bold red]findings[/]"
    if report.findings and not report.errors:
        status = "[bold yellow]warnings only[/]"
    return (
        f"{status}: {report.ops} ops traced, {report.backward_nodes} backward nodes, "
        f"{origins} origin{'s' if origins != 1 else ''}, {report.propagated} propagated, "
        f"{report.warnings} warning{'s' if report.warnings != 1 else ''} "
        f"in {report.seconds:.2f}s"
    )
