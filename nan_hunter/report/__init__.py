"""One emitter per output format; each turns a ``Report`` into text and prints nothing."""

from __future__ import annotations

from nan_hunter.findings import Report
from nan_hunter.report.json_report import render_json
from nan_hunter.report.text import render_text

FORMATS = ("text", "json")


def render(report: Report, fmt: str, *, color: bool = False, width: int = 100) -> str:
    if fmt == "json":
        return render_json(report)
    if fmt == "text":
        return render_text(report, color=color, width=width)
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
