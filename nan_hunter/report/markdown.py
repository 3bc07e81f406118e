"""The Markdown report, for a PR comment or a file: culprit first, stats table, verdict, diff."""

from __future__ import annotations

import re
from collections.abc import Iterable

from nan_hunter.core.range_map import RangeMap
from nan_hunter.core.untrusted import shown, shown_lines
from nan_hunter.findings import Finding, Phase, Report, Severity, SourceLocation
from nan_hunter.report.paths import display_path
from nan_hunter.report.range_map import ClosestRow, closest_rows, limits_text, margin_text
from nan_hunter.report.text import verdict_sentence as fp32_verdict
from nan_hunter.trace.summary import TensorStats, format_number

_PROSE_SPECIAL = re.compile(r"([\\`*_\[\]~]|<(?=[A-Za-z/!?]))")
"""What Markdown would read as markup in plain text: emphasis (``__add__``), links, HTML."""
_STATS_HEADER = (
    "| tensor | shape | dtype | min | max | NaN | +inf | -inf |\n"
    "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"
)


def render_markdown(report: Report) -> str:
    t = report.target
    blocks = [
        f"# nan-hunter: {code(display_path(t.file))} ({prose(t.mode)}, {prose(t.dtype)}, "
        f"{prose(t.device)}, "
        f"policy {prose(t.policy)}"
        f"{', ' + prose(t.loss_scaling.render()) if t.loss_scaling else ''}): {report.status}"
    ]
    if t.unchecked:
        blocks.append("\n".join(f"**Not checked:** {prose(note)}" for note in t.unchecked))
    errors = [f for f in report.active if f.severity is Severity.ERROR]
    others = [f for f in report.active if f.severity is not Severity.ERROR]
    blocks.extend(_error(f) for f in errors)
    if others:
        blocks.append(_warnings(report, others))
    if report.suppressed:
        blocks.append(_suppressed(report.suppressed))
    if not report.active:
        blocks.append("No findings.")
    if report.range_map is not None:
        blocks.append(_closest(report.range_map))
    blocks.append(_summary(report))
    return "\n\n".join(blocks) + "\n"


def _suppressed(findings: Iterable[Finding]) -> str:
    lines = ["## Suppressed", ""]
    for f in findings:
        assert f.suppression is not None
        where = f" at {code(_where(f.location))}" if f.location else ""
        lines.append(f"- **{f.code}**{where}: {prose(f.suppression.reason)}")
    return "\n".join(lines)


def _error(f: Finding) -> str:
    heading = f"## {f.code} · {f.kind.value}"
    if f.location is not None:
        heading += f" · {code(_where(f.location))}"
    blocks = [heading, prose(f.message)]
    facts: list[str] = []
    if f.location is not None:
        facts.append(f"- **code:** {code(f.location.code)}")
    if f.op:
        phase = " (backward)" if f.phase is Phase.BACKWARD else ""
        facts.append(f"- **op:** {code(f.op)}{phase} in module {code(f.module or '(root)')}")
    if facts:
        blocks.append("\n".join(facts))
    if f.inputs or f.outputs:
        blocks.append(_stats_table(f))
    facts = []
    if f.fp32_rerun is not None:
        facts.append(f"- **FP32:** {prose(fp32_verdict(f))}")
    if f.upstream is not None:
        cause = f"- **cause:** {code(f.upstream.op)}"
        if f.upstream.location is not None:
            where = f.upstream.location
            cause += f" at {code(_where(where))}: {code(where.code)}"
        facts.append(f"{cause} ({prose(f.upstream.reason)})")
    facts.extend(f"- **note:** {prose(note)}" for note in f.notes)
    if f.fix is not None:
        facts.append(f"- **fix** ({f.fix.applicability.value}): {prose(f.fix.title)}")
    if facts:
        blocks.append("\n".join(facts))
    if f.fix is not None and f.fix.diff:
        blocks.append(_fenced(f.fix.diff, "diff"))
    return "\n\n".join(blocks)


def _stats_table(f: Finding) -> str:
    in_label, out_label = ("grad in", "grad out") if f.phase is Phase.BACKWARD else ("in", "out")
    rows = [_stats_row(f"{in_label}[{i}]", s) for i, s in enumerate(f.inputs)]
    rows += [_stats_row(f"{out_label}[{i}]", s) for i, s in enumerate(f.outputs)]
    return "\n".join([_STATS_HEADER, *rows])


def _stats_row(label: str, s: TensorStats) -> str:
    def number(value: float | None) -> str:
        return "–" if value is None else format_number(value)

    shape = "[" + ", ".join(str(d) for d in s.shape) + "]"
    cells = [label, shape, prose(s.dtype), number(s.min), number(s.max),
             str(s.nan), str(s.posinf), str(s.neginf)]
    return _row(_cell(c) for c in cells)


def _warnings(report: Report, findings: list[Finding]) -> str:
    lines = [f"## Warnings ({report.warnings})", ""]
    if report.warnings > len(findings):
        lines += [f"{len(findings)} of {report.warnings} listed.", ""]
    lines += ["| code | location | message |", "| --- | --- | --- |"]
    for f in findings:
        where = code(_where(f.location)) if f.location is not None else "–"
        lines.append(_row([f.code, _cell(where), _cell(prose(f.message))]))
    blocks = ["\n".join(lines)]
    for f in findings:  # a warning with an edit to apply: its fix, as an error's
        if f.fix is not None and f.fix.edits and f.fix.diff:
            where = f" · {code(_where(f.location))}" if f.location is not None else ""
            blocks.append(f"### Fix for {f.code}{where}")
            blocks.append(f"- **fix** ({f.fix.applicability.value}): {prose(f.fix.title)}")
            blocks.append(_fenced(f.fix.diff, "diff"))
    return "\n\n".join(blocks)


def _closest(m: RangeMap) -> str:
    """The ops closest to the format's limits: a table per limit (the underflow one only when
    some values are below the smallest normal)."""
    top, bottom = closest_rows(m)
    lines = [
        f"## Closest to the {prose(m.format)} limits", "",
        f"{prose(limits_text(m))}. Margin: {prose(margin_text(m))}.", "",
        "| headroom | max \\|x\\| | phase | module | op | location |",
        "| ---: | ---: | --- | --- | --- | --- |",
    ]
    lines += [_closest_row(r) for r in top]
    if bottom:
        lines += [
            "", f"| below {format_number(m.smallest_normal)} | max \\|x\\| | phase | module | op "
            "| location |",
            "| ---: | ---: | --- | --- | --- | --- |",
        ]
        lines += [_closest_row(r) for r in bottom]
    return "\n".join(lines)


def _closest_row(r: ClosestRow) -> str:
    return _row([
        _cell(r.measure), _cell(r.value), _cell(prose(r.phase)), _cell(code(r.module)),
        _cell(code(r.op)),
        _cell(code(r.where)),
    ])


def _summary(report: Report) -> str:
    return (
        f"**Summary:** {_count(report.ops, 'op')}, "
        f"{_count(report.backward_nodes, 'backward node')}, "
        f"{_count(report.errors, 'error')}, {_count(report.warnings, 'warning')}, "
        f"{report.propagated} propagated, {report.seconds:.2f} s"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _where(loc: SourceLocation) -> str:
    return f"{display_path(loc.file)}:{loc.line}"


def prose(text: str) -> str:
    """Plain text from the model in a paragraph: one line (control characters and newlines
    shown escaped, so no blank line starts a block of its own) with Markdown's markup and HTML
    escaped."""
    return _PROSE_SPECIAL.sub(r"\\\1", shown(text))


def code(text: str) -> str:
    """An inline code span that survives backticks in ``text`` (CommonMark 6.1), on one line:
    a blank line would end the paragraph, and the span with it."""
    text = shown(text)
    runs = [len(run) for run in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fenced(text: str, info: str) -> str:
    """A fenced block longer than any backtick run inside ``text``: a closing fence may be
    indented (a diff's context line is), so every run counts, not only those at a line's start."""
    text = shown_lines(text)
    runs = [len(run) for run in re.findall(r"`+", text)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return f"{fence}{info}\n{text.rstrip(chr(10))}\n{fence}"


def _cell(text: str) -> str:
    """A table cell: one line (control characters shown escaped), pipes escaped (also inside
    code spans, per GFM)."""
    return shown(text).replace("|", "\\|")


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"
