"""One report for a run over several model files: every file's report, then a total.

- text, markdown, github: each file's report in turn, then a total line (text) or section.
- json: ``{"schema": "nan-hunter/reports/v1", "tool", "status", "reports": [<one
  nan-hunter/report/v1 object per file>], "failed": [{"path", "message"}], "summary": {"files",
  "scanned", "failed", "errors", "warnings", "suppressed"}}``; ``status`` is ``error`` when a
  file failed, else ``findings`` or ``clean``.
- sarif: one run whose results are those of every file; files that failed are the error
  notifications of an invocation with ``executionSuccessful: false``.
- junit: one suite, one test case per file (an ``error`` case per file that failed).

A run over a single path uses the single-report emitters unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nan_hunter.core.untrusted import echoed
from nan_hunter.findings import Failed, Report
from nan_hunter.report.github import escape_data, render_github
from nan_hunter.report.html import render_html_many
from nan_hunter.report.json_report import report_dict
from nan_hunter.report.junit import render_junit_many
from nan_hunter.report.markdown import code, prose, render_markdown
from nan_hunter.report.sarif import render_sarif_many
from nan_hunter.report.text import render_text
from nan_hunter.version import __version__

SCHEMA = "nan-hunter/reports/v1"


def render_many(
    reports: Sequence[Report],
    failed: Sequence[Failed],
    output_format: str,
    *,
    color: bool = False,
    width: int | None = None,
    range_map: bool = False,
) -> str:
    if output_format == "text":
        parts = [render_text(r, color=color, width=width, range_map=range_map) for r in reports]
        lines = [f"failed: {echoed(f.path)}: {echoed(f.message)}" for f in failed]
        return "\n".join([*parts, *lines, total_line(reports, failed)]) + "\n"
    if output_format == "json":
        return json.dumps(reports_dict(reports, failed), indent=2) + "\n"
    if output_format == "sarif":
        return render_sarif_many(reports, failed)
    if output_format == "junit":
        return render_junit_many(reports, failed)
    if output_format == "github":
        lines = [
            f"::error title=nan-hunter::{escape_data(f'{f.path}: {f.message}')}" for f in failed
        ]
        return "".join(render_github(r) for r in reports) + "".join(f"{x}\n" for x in lines)
    if output_format == "html":
        return render_html_many(reports, failed)
    if output_format == "markdown":
        blocks = [render_markdown(r) for r in reports]
        if failed:
            blocks.append(
                "# Not scanned\n\n"
                + "\n".join(f"- {code(f.path)}: {prose(f.message)}" for f in failed)
                + "\n"
            )
        blocks.append(f"**Total:** {total_line(reports, failed)}\n")
        return "\n---\n\n".join(blocks)
    raise ValueError(f"unknown format {output_format!r}")


def _summary(reports: Sequence[Report], failed: Sequence[Failed]) -> dict[str, int]:
    return {
        "files": len(reports) + len(failed),
        "scanned": len(reports),
        "failed": len(failed),
        "errors": sum(r.errors for r in reports),
        "warnings": sum(r.warnings for r in reports),
        "suppressed": sum(len(r.suppressed) for r in reports),
    }


def status(reports: Sequence[Report], failed: Sequence[Failed]) -> str:
    if failed:
        return "error"
    return "findings" if any(r.active for r in reports) else "clean"


def reports_dict(reports: Sequence[Report], failed: Sequence[Failed]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "tool": {"name": "nan-hunter", "version": __version__},
        "status": status(reports, failed),
        "reports": [report_dict(r) for r in reports],
        "failed": [{"path": f.path, "message": f.message} for f in failed],
        "summary": _summary(reports, failed),
    }


def total_line(reports: Sequence[Report], failed: Sequence[Failed]) -> str:
    s = _summary(reports, failed)
    with_findings = sum(1 for r in reports if r.active)

    def n(count: int, noun: str) -> str:
        return f"{count} {noun}{'' if count == 1 else 's'}"

    parts = [
        f"{n(s['files'], 'file')}: {with_findings} with findings",
        f"{s['scanned'] - with_findings} clean",
        f"{s['failed']} failed",
        n(s["errors"], "error"),
        n(s["warnings"], "warning"),
    ]
    if s["suppressed"]:
        parts.append(f"{s['suppressed']} suppressed")
    return "total: " + ", ".join(parts)
