"""SARIF 2.1.0 for code-scanning uploads: one run, every registered rule, one result per finding.

Fixes with edits become SARIF ``fixes``: each edit is one replacement of the original lines it
covers by its new lines (the same edits ``--fix`` applies; no diff is parsed back). Regions use
line/column numbers of the original file; ``run.columnKind`` is ``unicodeCodePoints``, so a column
is a Python ``str`` index plus one. The output is deterministic: no timestamps, paths relative
to the working directory.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any
from urllib.parse import quote

from nan_hunter.findings import Edit, Failed, Finding, Fix, OpRef, Report, Severity
from nan_hunter.fixes.edits import by_file, combine, text_digest
from nan_hunter.fixes.source_file import SourceError, read_source, split_lines
from nan_hunter.report.catalog import RuleInfo, rule_catalog
from nan_hunter.report.json_report import training_object
from nan_hunter.report.paths import repository_relative
from nan_hunter.version import __version__

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
INFORMATION_URI = "https://nan-hunter.dev"
"""The project's home, the same host as the JSON report schema's ``$id``."""

LEVELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}

def render_sarif(report: Report) -> str:
    return json.dumps(sarif_dict(report), indent=2) + "\n"


def render_sarif_many(reports: Sequence[Report], failed: Sequence[Failed] = ()) -> str:
    """One run holding the results of every report, in order; the model files that could not
    be scanned as the notifications of an unsuccessful invocation."""
    return json.dumps(sarif_dict_many(reports, failed), indent=2) + "\n"


def sarif_dict(report: Report) -> dict[str, Any]:
    return sarif_dict_many([report])


def sarif_dict_many(reports: Sequence[Report], failed: Sequence[Failed] = ()) -> dict[str, Any]:
    rules = rule_catalog()
    index = {rule.code: i for i, rule in enumerate(rules)}
    driver = {
        "name": "nan-hunter",
        "version": __version__,
        "informationUri": INFORMATION_URI,
        "rules": [_rule(rule) for rule in rules],
    }
    run: dict[str, Any] = {
        "tool": {"driver": driver},
        "columnKind": "unicodeCodePoints",
        "results": [_result(f, index.get(f.code), report.target.file)
                    for report in reports for f in report.findings],
    }
    training = [r.training for r in reports if r.training is not None]
    if training:  # nan-hunter run: the steps checked, also when there is no result
        run["properties"] = {"training": training_object(training[0])}
    if failed:  # a partial run must not read as a complete one
        run["invocations"] = [
            {"executionSuccessful": False,
             "toolExecutionNotifications": [_not_scanned(f) for f in failed]}
        ]
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def _not_scanned(failed: Failed) -> dict[str, Any]:
    note: dict[str, Any] = {
        "level": "error", "message": {"text": f"{failed.path}: {failed.message}"}
    }
    if failed.path.endswith(".py"):  # a file, not a pkg.module
        note["locations"] = [{"physicalLocation": {"artifactLocation": _artifact(failed.path)}}]
    return note


def _rule(rule: RuleInfo) -> dict[str, Any]:
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
    if f.call_site is not None:
        site = f.call_site
        result.setdefault("relatedLocations", []).append(
            {
                "id": len(result.get("relatedLocations", [])),
                "physicalLocation": {
                    "artifactLocation": _artifact(site.file),
                    "region": {"startLine": site.line, "snippet": {"text": site.code}},
                },
                "message": {"text": "called from your code here (the fix goes around this call)"},
            }
        )
    if f.suppression is not None:
        result["suppressions"] = [
            {"kind": "inSource", "status": "accepted", "justification": f.suppression.reason}
        ]
    if f.fix is not None and f.fix.edits:
        changes = _artifact_changes(f.fix)
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
    # a name that is not UTF-8 (held with surrogate escapes) is percent-encoded as its bytes
    return {"uri": quote(relative, errors="surrogateescape"), "uriBaseId": "%SRCROOT%"}


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
        "properties": {"applicability": fix.applicability.value, "verified": fix.verified},
    }


def _artifact_changes(fix: Fix) -> list[dict[str, Any]]:
    changes = []
    for path, edits in by_file(fix.edits).items():
        try:
            text = read_source(path).text
        except SourceError:
            return []
        if any(e.planned_on and e.planned_on != text_digest(text) for e in edits):
            return []  # the file changed since the scan: these offsets point elsewhere now
        starts = list(accumulate((len(x) for x in split_lines(text)), initial=0))
        changes.append(
            {
                "artifactLocation": _artifact(str(path)),
                "replacements": [_replacement(e, text, starts) for e in combine(edits)],
            }
        )
    return changes


def _position(offset: int, text: str, starts: list[int]) -> tuple[int, int]:
    """1-based ``(line, column)`` of a ``str`` offset (columns in code points); the end of a
    file that ends in a newline is column 1 of the line after its last one."""
    n_lines = len(starts) - 1
    if offset >= len(text) and n_lines and not text.endswith(("\n", "\r")):
        return n_lines, len(text) - starts[n_lines - 1] + 1
    line = min(bisect_right(starts, offset) - 1, n_lines)
    return line + 1, offset - starts[line] + 1


def _replacement(edit: Edit, text: str, starts: list[int]) -> dict[str, Any]:
    """One edit as a SARIF replacement: the deleted region runs from the edit's start to its
    end (column 1 of the line after the last replaced line, so the newline is included); a
    pure insertion is the empty region at its position. ``insertedContent`` holds the new
    lines with their own line endings."""
    start_line, start_column = _position(edit.start, text, starts)
    end_line, end_column = _position(edit.end, text, starts)
    region = {"startLine": start_line, "startColumn": start_column}
    if end_line != start_line:
        region["endLine"] = end_line
    region["endColumn"] = end_column
    replacement: dict[str, Any] = {"deletedRegion": region}
    if edit.replacement:
        replacement["insertedContent"] = {"text": edit.replacement}
    return replacement
