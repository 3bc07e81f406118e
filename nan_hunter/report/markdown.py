"""The Markdown report, for a PR comment or a file: culprit first, stats table, verdict, diff."""

from __future__ import annotations

import re
from collections.abc import Iterable

from nan_hunter.findings import Finding, Phase, Report, Severity, SourceLocation
from nan_hunter.report.paths import display_path
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
        f"# nan-hunter: {_code(display_path(t.file))} ({t.mode}, {t.dtype}, {t.device}, "
        f"policy {_prose(t.policy)}"
        f"{', ' + _prose(t.loss_scaling.render()) if t.loss_scaling else ''}): {report.status}"
    ]
    errors = [f for f in report.active if f.severity is Severity.ERROR]
    others = [f for f in report.active if f.severity is not Severity.ERROR]
    blocks.extend(_error(f) for f in errors)
    if others:
        blocks.append(_warnings(report, others))
    if report.suppressed:
        blocks.append(_suppressed(report.suppressed))
    if not report.active:
        blocks.append("No findings.")
    blocks.append(_summary(report))
    return "\n\n".join(blocks) + "\n"


def _suppressed(findings: Iterable[Finding]) -> str:
    lines = ["## Suppressed", ""]
    for f in findings:
        assert f.suppression is not None
        where = f" at {_where(f.location)}" if f.location else ""
        lines.append(f"- **{f.code}**{where}: {_prose(f.suppression.reason)}")
    return "\n".join(lines)


def _error(f: Finding) -> str:
    heading = f"## {f.code} · {f.kind.value}"
    if f.location is not None:
        heading += f" · {_code(_where(f.location))}"
    blocks = [heading, _prose(f.message)]
    facts: list[str] = []
    if f.location is not None:
        facts.append(f"- **code:** {_code(f.location.code)}")
    if f.op:
        phase = " (backward)" if f.phase is Phase.BACKWARD else ""
        facts.append(f"- **op:** {_code(f.op)}{phase} in module {_code(f.module or '(root)')}")
    if facts:
        blocks.append("\n".join(facts))
    if f.inputs or f.outputs:
        blocks.append(_stats_table(f))
    facts = []
    if f.fp32_rerun is not None:
        facts.append(f"- **FP32:** {_prose(fp32_verdict(f))}")
    if f.upstream is not None:
        cause = f"- **cause:** {_code(f.upstream.op)}"
        if f.upstream.location is not None:
            where = f.upstream.location
            cause += f" at {_code(_where(where))}: {_code(where.code)}"
        facts.append(f"{cause} ({_prose(f.upstream.reason)})")
    facts.extend(f"- **note:** {_prose(note)}" for note in f.notes)
    if f.fix is not None:
        facts.append(f"- **fix** ({f.fix.applicability.value}): {_prose(f.fix.title)}")
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
    cells = [label, shape, s.dtype, number(s.min), number(s.max),
             str(s.nan), str(s.posinf), str(s.neginf)]
    return _row(_cell(c) for c in cells)


def _warnings(report: Report, findings: list[Finding]) -> str:
    lines = [f"## Warnings ({report.warnings})", ""]
    if report.warnings > len(findings):
        lines += [f"{len(findings)} of {report.warnings} listed.", ""]
    lines += ["| code | location | message |", "| --- | --- | --- |"]
    for f in findings:
        where = _code(_where(f.location)) if f.location is not None else "–"
        lines.append(_row([f.code, _cell(where), _cell(_prose(f.message))]))
    return "\n".join(lines)


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


def _prose(text: str) -> str:
    return _PROSE_SPECIAL.sub(r"\\\1", text)


def _code(text: str) -> str:
    """An inline code span that survives backticks in ``text`` (CommonMark 6.1)."""
    runs = [len(run) for run in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fenced(text: str, info: str) -> str:
    runs = [len(run) for run in re.findall(r"^`{3,}", text, flags=re.MULTILINE)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return f"{fence}{info}\n{text.rstrip(chr(10))}\n{fence}"


def _cell(text: str) -> str:
    """A table cell: pipes escaped (also inside code spans, per GFM), newlines flattened."""
    return " ".join(text.splitlines()).replace("|", "\\|")


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"
