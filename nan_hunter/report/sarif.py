"""SARIF 2.1.0 for code-scanning uploads: one run, every registered rule, one result per finding.

Fixes with a diff become SARIF ``fixes``: each hunk of the unified diff is one replacement of the
hunk's old lines (context included) by its new lines. Regions use line/column numbers of the
original file; ``run.columnKind`` is ``unicodeCodePoints``, so a column is a Python ``str`` index
plus one. The output is deterministic: no timestamps, paths relative to the working directory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from nan_hunter import __version__
from nan_hunter.findings import Finding, Fix, OpRef, Report, Severity
from nan_hunter.report.paths import repository_relative
from nan_hunter.rules.registry import Rule, all_rules

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
INFORMATION_URI = "https://nan-hunter.dev"
"""The project's home, the same host as the JSON report schema's ``$id``."""

LEVELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}

_HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_DIFF_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
"""Lines as the fix builder splits them (on CRLF, CR and LF), endings kept."""
_NO_NEWLINE = "\\ No newline at end of file"


@dataclass(frozen=True)
class Hunk:
    """One hunk of a unified diff; lines keep their own line endings."""

    old_start: int
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]


@dataclass(frozen=True)
class FilePatch:
    path: str
    """The ``b/`` path of the diff without its prefix (relative to the diff's base folder)."""
    hunks: tuple[Hunk, ...]


def render_sarif(report: Report) -> str:
    return json.dumps(sarif_dict(report), indent=2) + "\n"


def render_sarif_many(reports: Sequence[Report]) -> str:
    """One run holding the results of every report, in order."""
    return json.dumps(sarif_dict_many(reports), indent=2) + "\n"


def sarif_dict(report: Report) -> dict[str, Any]:
    return sarif_dict_many([report])


def sarif_dict_many(reports: Sequence[Report]) -> dict[str, Any]:
    rules = all_rules()
    index = {rule.code: i for i, rule in enumerate(rules)}
    driver = {
        "name": "nan-hunter",
        "version": __version__,
        "informationUri": INFORMATION_URI,
        "rules": [_rule(rule) for rule in rules],
    }
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [
            {
                "tool": {"driver": driver},
                "columnKind": "unicodeCodePoints",
                "results": [_result(f, index.get(f.code), report.target.file)
                            for report in reports for f in report.findings],
            }
        ],
    }


def _rule(rule: Rule) -> dict[str, Any]:
    doc = {"text": rule.doc, "markdown": rule.doc}
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": doc,
        "help": doc,
        "defaultConfiguration": {"level": LEVELS[rule.severity]},
    }


def _result(f: Finding, rule_index: int | None, target_file: str) -> dict[str, Any]:
    result: dict[str, Any] = {"ruleId": f.code}
    if rule_index is not None:
        result["ruleIndex"] = rule_index
    result["level"] = LEVELS[f.severity]
    result["message"] = {"text": f.message}
    location: dict[str, Any] = {}
    if f.location is not None:
        location["physicalLocation"] = {
            "artifactLocation": _artifact(f.location.file),
            "region": {"startLine": f.location.line, "snippet": {"text": f.location.code}},
        }
    if f.module:
        location["logicalLocations"] = [
            {"name": f.module.rsplit(".", 1)[-1], "fullyQualifiedName": f.module, "kind": "module"}
        ]
    if location:
        result["locations"] = [location]
    if f.upstream is not None and f.upstream.location is not None:
        result["relatedLocations"] = [_related(f.upstream)]
    if f.suppression is not None:
        result["suppressions"] = [
            {"kind": "inSource", "status": "accepted", "justification": f.suppression.reason}
        ]
    if f.fix is not None and f.fix.diff:
        base = f.fix.file or (f.location.file if f.location else target_file)
        changes = _artifact_changes(f.fix.diff, Path(base).parent)
        if changes:
            result["fixes"] = [_fix(f.fix, changes)]
    result["properties"] = _properties(f)
    return result


def _artifact(path: str) -> dict[str, Any]:
    """Relative to ``%SRCROOT%``, the repository holding the working directory (the working
    directory outside a repository), for a file inside it: the form code scanning maps onto the
    repository's files. Any other file (an installed library) gets an absolute ``file:`` URI."""
    relative = repository_relative(path)
    if relative is None:
        return {"uri": Path(path).resolve().as_uri()}
    return {"uri": quote(relative), "uriBaseId": "%SRCROOT%"}


def _related(ref: OpRef) -> dict[str, Any]:
    assert ref.location is not None
    return {
        "id": 0,
        "physicalLocation": {
            "artifactLocation": _artifact(ref.location.file),
            "region": {"startLine": ref.location.line, "snippet": {"text": ref.location.code}},
        },
        "message": {"text": f"upstream cause ({ref.reason}): {ref.op}"},
    }


def _properties(f: Finding) -> dict[str, Any]:
    rerun = f.fp32_rerun
    props: dict[str, Any] = {
        "kind": f.kind.value,
        "phase": f.phase.value,
        "op": f.op,
        "origin": f.origin,
        "fp32_rerun": None
        if rerun is None
        else {
            "finite": rerun.finite,
            "abs_max": rerun.abs_max,
            "own_inputs_finite": rerun.own_inputs_finite,
        },
    }
    if f.fix is not None:
        props["fix"] = {"title": f.fix.title, "applicability": f.fix.applicability.value}
    return props


def _fix(fix: Fix, changes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "description": {"text": fix.title},
        "artifactChanges": changes,
        "properties": {"applicability": fix.applicability.value},
    }


def _artifact_changes(diff: str, base: Path) -> list[dict[str, Any]]:
    return [
        {
            "artifactLocation": _artifact(str(base / patch.path)),
            "replacements": [_replacement(hunk) for hunk in patch.hunks],
        }
        for patch in parse_unified_diff(diff)
        if patch.hunks
    ]


def _replacement(hunk: Hunk) -> dict[str, Any]:
    """One hunk as a SARIF replacement of whole lines of the original file.

    The deleted region runs from column 1 of the hunk's first old line to column 1 of the line
    after its last one, so it includes that line's newline (a text region given by ``startLine``
    and ``endLine`` alone stops before it: a missing ``endColumn`` means the end of the line,
    newline excluded). When the last old line ends the file without a newline, the region ends
    just past its last character instead. A pure insertion (no old lines; the diff's old start
    names the line it follows) is the empty region ``startColumn == endColumn == 1`` on the line
    it goes before. ``insertedContent`` holds the new lines with their own endings
    (``"\\n".join(lines) + "\\n"`` for a file with LF endings); a pure deletion has none.
    """
    if hunk.old_lines:
        first = hunk.old_start
        last = first + len(hunk.old_lines) - 1
        tail = hunk.old_lines[-1]
        stripped = tail.rstrip("\r\n")
        if stripped != tail:
            end_line, end_column = last + 1, 1
        else:
            end_line, end_column = last, len(stripped) + 1
        region = {"startLine": first, "startColumn": 1, "endLine": end_line,
                  "endColumn": end_column}
    else:
        region = {"startLine": hunk.old_start + 1, "startColumn": 1, "endColumn": 1}
    replacement: dict[str, Any] = {"deletedRegion": region}
    if hunk.new_lines:
        replacement["insertedContent"] = {"text": "".join(hunk.new_lines)}
    return replacement


def parse_unified_diff(diff: str) -> list[FilePatch]:
    """The files and hunks of a unified diff with ``a/``/``b/`` paths, as the fixes write them.

    Hunk bodies are read by their line counts, so removed lines that look like headers are safe;
    a ``\\ No newline at end of file`` marker strips the newline the diff gave the line before it.
    """
    lines = _DIFF_LINE.findall(diff)
    patches: list[FilePatch] = []
    path: str | None = None
    hunks: list[Hunk] = []
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r\n")
        i += 1
        if line.startswith("--- "):
            if path is not None:
                patches.append(FilePatch(path, tuple(hunks)))
            path, hunks = None, []
        elif line.startswith("+++ "):
            path = _strip_prefix(line[4:], "b/")
        elif (header := _HUNK_HEADER.match(line)) is not None and path is not None:
            old_count = int(header.group(2) or 1)
            new_count = int(header.group(4) or 1)
            hunk, i = _read_hunk(lines, i, int(header.group(1)), old_count, new_count)
            hunks.append(hunk)
    if path is not None:
        patches.append(FilePatch(path, tuple(hunks)))
    return patches


def _read_hunk(
    lines: list[str], i: int, old_start: int, old_count: int, new_count: int
) -> tuple[Hunk, int]:
    old: list[str] = []
    new: list[str] = []
    touched: list[list[str]] = []
    while (len(old) < old_count or len(new) < new_count) and i < len(lines):
        raw = lines[i]
        i += 1
        if raw.rstrip("\r\n") == _NO_NEWLINE:
            _strip_last_newline(touched)
            continue
        tag, text = raw[:1], raw[1:]
        if tag in ("\r", "\n"):  # an empty context line written without its leading space
            tag, text = " ", raw
        touched = [old] if tag == "-" else [new] if tag == "+" else [old, new]
        for side in touched:
            side.append(text)
    if i < len(lines) and lines[i].rstrip("\r\n") == _NO_NEWLINE:
        _strip_last_newline(touched)
        i += 1
    return Hunk(old_start, tuple(old), tuple(new)), i


def _strip_last_newline(sides: list[list[str]]) -> None:
    for side in sides:
        if side:
            side[-1] = side[-1].removesuffix("\n")


def _strip_prefix(path: str, prefix: str) -> str:
    path = path.split("\t", 1)[0]
    return path[len(prefix):] if path.startswith(prefix) else path
