"""Inline suppressions: ``# nan-hunter: ignore[CODE] -- reason`` on a finding's line, in text,
JSON (validated against the report schema) and SARIF (validated against the official schema)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.project.suppressions import Directive, parse_comment
from tests.conftest import EXAMPLES, ROOT
from tests.test_report_emitters import SARIF_SCHEMA_FILE

runner = CliRunner()
CULPRIT = "        scores = q @ k.transpose(-2, -1)  # missing: / math.sqrt(d_model)\n"
REASON = "scores are bounded by the mask in production"


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "100", **(env or {})})
    return result.exit_code, result.stdout, result.stderr


def _attention(tmp_path: Path, comment: str) -> Path:
    """attention_unscaled.py (one NH102 error) with ``comment`` on the culprit line."""
    source = (EXAMPLES / "attention_unscaled.py").read_text(encoding="utf-8")
    assert source.count(CULPRIT) == 1
    path = tmp_path / "attention.py"
    path.write_text(
        source.replace(CULPRIT, f"        scores = q @ k.transpose(-2, -1)  {comment}\n"),
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("# nan-hunter: ignore[NH102] -- why not", Directive(3, ("NH102",), "why not")),
        ("#nan-hunter:ignore[nh102, NH5]--  spaced  ", Directive(3, ("NH102", "NH5"), "spaced")),
        ("# nan-hunter: ignore[NH102]", Directive(3, ("NH102",), "")),
        ("# nan-hunter: ignore[NH102] no separator", Directive(3, ("NH102",), "")),
        ("# noqa: NH102", None),
        ("# nan-hunter: ignore NH102 -- x", None),
    ],
)
def test_parse_comment(comment: str, expected: Directive | None) -> None:
    assert parse_comment(comment, 3) == expected


def test_suppressed_finding_in_the_api(tmp_path: Path) -> None:
    report = scan_file(str(_attention(tmp_path, f"# nan-hunter: ignore[NH102] -- {REASON}")))
    assert [f.code for f in report.findings] == ["NH102"]
    (finding,) = report.findings
    assert finding.suppression is not None
    assert finding.suppression.reason == REASON
    assert finding.suppression.line == finding.location.line  # type: ignore[union-attr]
    assert report.active == () and report.errors == 0
    assert report.status == "clean" and report.exit_code() == 0


def test_prefix_and_other_codes(tmp_path: Path) -> None:
    prefix = scan_file(str(_attention(tmp_path, "# nan-hunter: ignore[NH1] -- all overflow")))
    assert len(prefix.suppressed) == 1
    other = scan_file(str(_attention(tmp_path, "# nan-hunter: ignore[NH101] -- not this one")))
    assert other.suppressed == () and other.exit_code() == 1


def test_text_report_and_exit_code(tmp_path: Path) -> None:
    path = _attention(tmp_path, f"# nan-hunter: ignore[NH102] -- {REASON}")
    code, out, _ = invoke("scan", str(path), "--no-verify")
    assert code == 0
    lines = out.splitlines()
    start = lines.index("suppressed (1)")
    assert lines[start + 1].startswith("error[NH102] overflow: ")
    assert lines[start + 2] == f"  suppressed: {REASON}"
    assert "error[NH102]" not in "\n".join(lines[:start])  # not among the active findings
    assert lines[-1].startswith("clean: ") and ", 1 suppressed in " in lines[-1]
    assert invoke("scan", str(path), "--no-verify", "--format", "github")[1].startswith(
        "nan-hunter: 0 errors"
    )


def test_json_report(tmp_path: Path) -> None:
    path = _attention(tmp_path, f"# nan-hunter: ignore[NH102] -- {REASON}")
    code, out, _ = invoke("scan", str(path), "--no-verify", "--format", "json")
    assert code == 0
    data = json.loads(out)
    schema = json.loads((ROOT / "nan_hunter" / "report" / "report.schema.json").read_text())
    jsonschema.validate(data, schema)
    assert data["status"] == "clean"
    assert data["summary"]["errors"] == 0 and data["summary"]["suppressed"] == 1
    (finding,) = data["findings"]
    assert finding["suppressed"] is True
    line = finding["location"]["line"]
    assert finding["suppression"] == {"reason": REASON, "file": str(path), "line": line}


def test_sarif_suppressions_validate(tmp_path: Path) -> None:
    path = _attention(tmp_path, f"# nan-hunter: ignore[NH102] -- {REASON}")
    code, out, _ = invoke("scan", str(path), "--no-verify", "--format", "sarif")
    assert code == 0
    data = json.loads(out)
    schema = json.loads(SARIF_SCHEMA_FILE.read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert [e.message for e in validator.iter_errors(data)] == []
    (result,) = data["runs"][0]["results"]
    assert result["ruleId"] == "NH102"
    assert result["suppressions"] == [
        {"kind": "inSource", "status": "accepted", "justification": REASON}
    ]


def test_a_suppression_needs_a_reason(tmp_path: Path) -> None:
    path = _attention(tmp_path, "# nan-hunter: ignore[NH102]")
    report = scan_file(str(path))
    assert report.suppressed == () and report.exit_code() == 1
    (note,) = report.target.notes
    assert note.startswith(f"{path}:") and "has no reason, so NH102 is not suppressed" in note
    code, out, _ = invoke("scan", str(path), "--no-verify")
    assert code == 1
    assert "has no reason, so NH102 is not suppressed" in out
    data = json.loads(invoke("scan", str(path), "--no-verify", "--format", "json")[1])
    assert "suppressed" not in data["findings"][0]
    assert any("has no reason" in n for n in data["target"]["notes"])


def test_fix_leaves_a_suppressed_finding_alone(tmp_path: Path) -> None:
    path = _attention(tmp_path, f"# nan-hunter: ignore[NH102] -- {REASON}")
    before = path.read_text(encoding="utf-8")
    code, _, err = invoke("scan", str(path), "--fix", "--no-backup")
    assert code == 0
    assert path.read_text(encoding="utf-8") == before
    assert "fixed" not in err
