"""GitHub Actions workflow commands: one annotation per finding, then a plain summary line.
An annotation's file is its path from the repository root (the working directory outside one).

Escaping follows the Actions runner: in the message ``%``, CR and LF are percent-encoded; in
property values (file, line, title) also ``:`` and ``,``, which would end the value. Every other
control character from the model is shown escaped (``nan_hunter.core.untrusted``): the log renders
terminal sequences. The summary line is not a command, but it names the model file: it is escaped
the same way, so no newline in a file name starts a workflow command of its own.
"""

from __future__ import annotations

from nan_hunter.core.untrusted import shown
from nan_hunter.findings import Finding, Report, Severity
from nan_hunter.report.paths import display_path, repository_relative

COMMANDS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def render_github(report: Report) -> str:
    lines = [annotation(f) for f in report.active]  # suppressed findings are not annotated
    lines.append(_summary(report))
    return "\n".join(lines) + "\n"


def annotation(f: Finding) -> str:
    """``::error file=...,line=...,title=NH101 overflow::message``; no file/line without one."""
    params: list[tuple[str, str]] = []
    if f.location is not None:
        # GitHub places an annotation by its path from the repository root, wherever the step
        # runs (``working-directory``), as SARIF does
        file = repository_relative(f.location.file) or display_path(f.location.file)
        params += [("file", file), ("line", str(f.location.line))]
    params.append(("title", f"{f.code} {f.kind.value}"))
    props = ",".join(f"{key}={escape_property(value)}" for key, value in params)
    return f"::{COMMANDS[f.severity]} {props}::{escape_data(f.message)}"


def escape_data(text: str) -> str:
    """A command's message: GitHub's ``%``, CR, LF encoding (the annotation shows the line
    breaks), then every other control character shown escaped."""
    return shown(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _summary(report: Report) -> str:
    """Not a workflow command: it starts with the tool's name, so the runner prints it as is."""
    errors, warnings = report.errors, report.warnings
    return (
        f"nan-hunter: {errors} error{'' if errors == 1 else 's'}, "
        f"{warnings} warning{'' if warnings == 1 else 's'} in "
        f"{escape_data(display_path(report.target.file))}"
    )
