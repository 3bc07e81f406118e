"""One emitter per output format; each turns a ``Report`` into text and prints nothing."""

from __future__ import annotations

from collections.abc import Callable

from nan_hunter.findings import Report
from nan_hunter.project.choices import OutputFormat
from nan_hunter.report.github import render_github
from nan_hunter.report.html import render_html
from nan_hunter.report.json_report import render_json
from nan_hunter.report.junit import render_junit
from nan_hunter.report.markdown import render_markdown
from nan_hunter.report.sarif import render_sarif
from nan_hunter.report.text import render_text

FORMATS = tuple(f.value for f in OutputFormat)

_PLAIN: dict[str, Callable[[Report], str]] = {
    "json": render_json,
    "markdown": render_markdown,
    "html": render_html,
    "sarif": render_sarif,
    "github": render_github,
    "junit": render_junit,
}
"""Formats with no terminal options (everything but text)."""


def render(
    report: Report,
    output_format: str = "text",
    *,
    color: bool = False,
    width: int | None = None,
    range_map: bool = False,
) -> str:
    """``report`` in ``output_format`` (text, json, markdown, html, sarif, github, junit), as the
    CLI prints it. For text only: ``color``; ``width`` lays it out to that many columns (at
    least 80), None writes its lines unwrapped; ``range_map`` lists every module's range (else
    the ops closest to the limits only)."""
    if output_format == "text":
        return render_text(report, color=color, width=width, range_map=range_map)
    emitter = _PLAIN.get(output_format)
    if emitter is None:
        raise ValueError(
            f"unknown format {output_format!r}; choose one of {', '.join(FORMATS)}"
        )
    return emitter(report)

