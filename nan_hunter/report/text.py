"""The terminal report (rich): culprit first, with code, stats, FP32 verdict, fix and diff.

With a ``width`` (a terminal's), rich lays the report out to it: a long headline or row wraps with a
hanging indent under its own text (labels stay in their column). Without one (a pipe, a file, the
golden files) every line is written whole, as long as it is. Diffs are never wrapped: they stay
copyable.
"""

from __future__ import annotations

from collections.abc import Iterable
from io import StringIO
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax
from rich.text import Text

from nan_hunter.core.range_map import RangeMap
from nan_hunter.core.untrusted import shown, shown_lines
from nan_hunter.findings import (
    Applicability,
    Finding,
    Fix,
    Phase,
    Report,
    Severity,
    loss_change_text,
)
from nan_hunter.precision.scale_window import scale_advice
from nan_hunter.report.paths import display_path
from nan_hunter.report.range_map import (
    MODULE_HEADER,
    closest_rows,
    limits_text,
    margin_text,
    module_cells,
)
from nan_hunter.trace.summary import format_number

if TYPE_CHECKING:
    from nan_hunter.report.catalog import RuleInfo

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


MIN_WIDTH = 80
"""The narrowest layout: a narrower terminal gets lines of 80 columns (its own wrapping).
(``nan_hunter.cli.terminal`` has the same constant without importing the report, and torch.)"""


def render_text(
    report: Report, *, color: bool = False, width: int | None = None, range_map: bool = False
) -> str:
    """The report; laid out to ``width`` columns (at least 80) when given, else unwrapped;
    ``range_map``: every module's range, not only the ops closest to the limits."""
    buffer = StringIO()
    console = Console(
        file=buffer,
        width=max(width, MIN_WIDTH) if width is not None else 100,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        emoji=False,
        soft_wrap=width is None,
    )
    t = report.target
    # an FP32 analysis (a training step that ran in FP32) has no autocast or half mode to name
    how = "float32" if t.dtype == "float32" else f"{_safe(t.mode)} {_safe(t.dtype)}"
    _paragraph(
        console,
        f"[bold]nan-hunter[/] {_safe(display_path(t.file))}: {how} "
        f"on {_safe(t.device)} (policy {_safe(t.policy)}"
        f"{', ' + _safe(t.loss_scaling.render()) if t.loss_scaling else ''})",
    )
    if report.precision_check is not None:
        _hanging(console, "  [bold]precision vs FP32:[/]",
                 _safe(report.precision_check.render()))
    for note in t.notes:
        _hanging(console, "  [dim]note[/] ", _safe(note))
    for note in t.unchecked:
        _hanging(console, "  [bold yellow]not checked[/] ", _safe(note))
    errors = [f for f in report.active if f.severity is Severity.ERROR]
    warnings = [f for f in report.active if f.severity is not Severity.ERROR]
    for finding in errors:
        console.print()
        _finding(console, finding, detailed=True)
    if warnings:
        console.print()
        console.print(f"[bold]warnings[/] ({report.warnings})")
        for finding in warnings:
            _finding(console, finding, detailed=False)
    if report.suppressed:
        console.print()
        console.print(f"[bold]suppressed[/] ({len(report.suppressed)})")
        for finding in report.suppressed:
            _finding(console, finding, detailed=False)
    console.print()
    if report.range_map is not None:
        _ranges(console, report.range_map, every_module=range_map)
    if report.loss_scale is not None and any(f.phase is Phase.BACKWARD for f in report.findings):
        _paragraph(
            console, f"[bold]loss scale[/]: {_safe(scale_advice(report.loss_scale, t.dtype))}"
        )
    _paragraph(console, _summary(report))
    return buffer.getvalue()


def render_rules(rules: Iterable[RuleInfo], *, width: int | None = None) -> str:
    """``nan-hunter rules``: code, severity, name and summary per line; laid out to ``width``
    columns (at least 80) with the summary wrapped under itself, or unwrapped when None."""
    buffer = StringIO()
    console = Console(
        file=buffer,
        width=max(width, MIN_WIDTH) if width is not None else 100,
        no_color=True,
        highlight=False,
        emoji=False,
        soft_wrap=width is None,
    )
    for rule in rules:
        head = f"{rule.code}  {rule.severity.value:<7}  {rule.name:<34}"
        if console.soft_wrap:
            console.print(f"{head}  {escape(rule.summary)}")
        elif console.width - len(head) - 2 >= _RULES_SUMMARY_MIN:
            _wrapped(console, Text(head + " "), Text(rule.summary))
        else:  # too narrow for a summary column: the summary goes below, under the severity
            console.print(Text(head.rstrip()), soft_wrap=True)
            _wrapped(console, Text(" " * (len(rule.code) + 1)), Text(rule.summary))
    return buffer.getvalue()


_RULES_SUMMARY_MIN = 50
"""Narrowest summary column beside the code, severity and name; narrower, it goes below."""


def _finding(console: Console, f: Finding, *, detailed: bool) -> None:
    style = _STYLE[f.severity] if f.suppression is None else "dim"
    _hanging(
        console,
        f"[{style}]{f.severity.value}[{_safe(f.code)}][/]",
        f"[bold]{f.kind.value}[/]: {_safe(f.message)}",
    )
    if f.suppression is not None:
        _hanging(console, "  [dim]suppressed:[/]", _safe(f.suppression.reason))
    if f.location is not None:
        where = f"{_safe(display_path(f.location.file))}:{f.location.line}"
        _hanging(console, "  [blue]-->[/]", where)
        _hanging(console, "   [blue]|[/] ", _safe(f.location.code))
    if not detailed:
        rows = [("why", f.notes[0])] if f.origin and f.notes else []
        fixable = f.fix is not None and bool(f.fix.edits) and f.suppression is None
        if fixable:  # a warning with an edit to apply: the fix too
            rows += _fix_rows(f.fix)
        _rows(console, rows)
        if fixable:
            _diffs(console, f.fix)
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
    if f.call_site is not None:
        where = f"{display_path(f.call_site.file)}:{f.call_site.line}"
        rows.append(("called at", f"{where}  {f.call_site.code}"))
    if f.fix is not None:
        rows += _fix_rows(f.fix)
    rows.extend(("also", note) for note in f.notes)
    _rows(console, rows)
    _diffs(console, f.fix)


def _fix_rows(fix: Fix) -> list[tuple[str, str]]:
    rows = [("fix", f"{fix.title} [{_fix_status(fix)}]")]
    if fix.verified is not None and fix.remaining:
        rows.append(("after fix", "; ".join(fix.remaining)))
    for alt in fix.alternatives:
        rows.append(("or", f"{alt.title} [{_fix_status(alt)}]"))
        if alt.verified is not None and alt.remaining:
            rows.append(("after it", "; ".join(alt.remaining)))
    return rows


def _diffs(console: Console, fix: Fix | None) -> None:
    if fix is None:
        return
    for diff in (fix.diff, *(alt.diff for alt in fix.alternatives)):
        if diff:
            console.print(Syntax(shown_lines(diff.rstrip("\n")), "diff", theme="ansi_dark",
                                 background_color="default"), soft_wrap=True)


def _ranges(console: Console, m: RangeMap, *, every_module: bool) -> None:
    """The ops closest to the format's limits (and, asked for, every module's range), as
    aligned columns; at a terminal's width a row too long wraps under its own text."""
    top, bottom = closest_rows(m)
    _paragraph(console, f"[bold]closest to the limits[/] ({_safe(limits_text(m))})")
    _line(console, "  margin   ", margin_text(m))
    for line in _columns([[r.measure, r.value, r.phase, r.module, r.op, r.where] for r in top]):
        _line(console, "  headroom ", line)
    for line in _columns(
        [[r.measure, r.value, r.phase, r.module, r.op, r.where] for r in bottom]
    ):
        _line(console, "  < normal ", line)
    if every_module:
        console.print()
        console.print(Text("range map", "bold"), soft_wrap=True)
        rows = [MODULE_HEADER, *(module_cells(m, row) for row in m.modules)]
        for line in _columns(rows):
            _line(console, "  ", line)
    console.print()


def _line(console: Console, head: str, body: str) -> None:
    """``head`` and ``body`` (plain text, shown escaped) on one line, wrapped under the body
    when the console has a width."""
    if console.soft_wrap:
        console.print(Text(head + shown(body)), soft_wrap=True)
    else:
        _wrapped(console, Text(head[:-1]), Text(shown(body)))


def _columns(rows: list[list[str]]) -> list[str]:
    """Rows of cells (the model's text shown escaped) padded into aligned columns."""
    cells = [[shown(c) for c in row] for row in rows]
    if not cells:
        return []
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]


def _safe(text: str) -> str:
    """A value from the model (a name, a message, a source line) as rich markup: control
    characters shown escaped (``nan_hunter.core.untrusted``), markup characters escaped."""
    return escape(shown(text))


def _hanging(console: Console, head: str, body: str) -> None:
    """``head body`` on one line; when wrapped, the body's next lines start under its first."""
    if console.soft_wrap:
        console.print(f"{head} {body}")
        return
    _wrapped(console, Text.from_markup(head), Text.from_markup(body))


def _rows(console: Console, rows: list[tuple[str, str]]) -> None:
    """Label/value rows under a finding: labels in a column of their own, values beside them."""
    if not rows:
        return
    label_width = max(len(label) for label, _ in rows)
    for label, value in rows:
        if console.soft_wrap:
            console.print(f"  [dim]{label.ljust(label_width)}[/]  {_safe(value)}")
        else:
            head = Text.assemble("  ", (label.ljust(label_width), "dim"), " ")
            _wrapped(console, head, Text(shown(value)))


def _paragraph(console: Console, markup: str) -> None:
    """A line of prose; when wrapped, its next lines are indented by two columns."""
    if console.soft_wrap:
        console.print(markup)
        return
    text = Text.from_markup(markup)
    first, *rest = text.wrap(console, console.width, overflow="fold")
    first.rstrip()
    console.print(first, soft_wrap=True)
    if rest:
        _wrapped(console, Text(" "), Text(" ").join(rest))


def _wrapped(console: Console, head: Text, body: Text) -> None:
    """``head`` then ``body`` wrapped (rich's word wrap, long words folded) into the columns
    right of it, every further line indented to where the body starts."""
    indent = head.cell_len + 1
    lines = body.wrap(console, max(console.width - indent, 20), overflow="fold")
    for i, line in enumerate(lines):
        line.rstrip()
        prefix = Text.assemble(head, " ") if i == 0 else Text(" " * indent)
        console.print(Text.assemble(prefix, line), soft_wrap=True)


def _fix_status(fix: Fix) -> str:
    status = fix.applicability.value
    if fix.applicability is Applicability.UNSAFE and fix.fp32_loss_change is not None:
        status = f"{status}, measured: {loss_change_text(fix.fp32_loss_change)}"
    if fix.verified is True:
        cost = f"; {fix.cost.render()}" if fix.cost is not None else ""
        return f"{status}, verified by re-scan{cost}"
    if fix.verified is False:
        failed = fix.remaining and fix.remaining[0].startswith("the re-scan failed")
        return f"{status}, NOT verified: {'the re-scan failed' if failed else 'see after fix'}"
    if fix.diff is None:
        return f"{status}, advice only"
    return f"{status}, not re-scanned"


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
    origins = sum(1 for f in report.active if f.origin and f.severity is Severity.ERROR)
    status = "[bold green]clean[/]" if not report.active else "[bold red]findings[/]"
    if report.active and not report.errors:
        status = "[bold yellow]warnings only[/]"
    if report.status == "not_checked":
        status = "[bold yellow]not checked[/]"
    suppressed = f", {len(report.suppressed)} suppressed" if report.suppressed else ""
    return (
        f"{status}: {report.ops} ops traced, {report.backward_nodes} backward nodes, "
        f"{origins} origin{'s' if origins != 1 else ''}, {report.propagated} propagated, "
        f"{report.warnings} warning{'s' if report.warnings != 1 else ''}{suppressed} "
        f"in {report.seconds:.2f}s"
    )
