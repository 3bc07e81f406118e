"""The markdown, SARIF, GitHub and JUnit emitters: golden files, schema, fixes, escaping, CLI.

Regenerate the golden files after an intended change with ``pytest --update-golden``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from nan_hunter.cli.commands import OutputFormat, app
from nan_hunter.findings import (
    Applicability,
    Finding,
    Fix,
    Kind,
    Phase,
    Report,
    ScanTarget,
    Severity,
    SourceLocation,
)
from nan_hunter.fixes.build import make_fix
from nan_hunter.fixes.edits import apply_edits, edits_between
from nan_hunter.report import FORMATS, render
from nan_hunter.report.github import render_github
from nan_hunter.report.junit import render_junit
from nan_hunter.report.markdown import render_markdown
from nan_hunter.report.sarif import render_sarif
from nan_hunter.rules import all_rules
from tests.conftest import EXAMPLES, FIXTURES, GOLDEN, ROOT, marker_line, scanned

SARIF_SCHEMA_FILE = Path(__file__).resolve().parent / "data" / "sarif-schema-2.1.0.json"
"""The official SARIF 2.1.0 schema (OASIS), vendored so the validation runs in any clone."""
EMITTER_GOLDEN = GOLDEN / "emitters"
EXTENSIONS = {
    "markdown": "md", "sarif": "sarif", "github": "github.txt", "junit": "junit.xml",
    "html": "html",
}

MATRIX_INVERSE = EXAMPLES / "matrix_inverse.py"
BAD_INPUT = FIXTURES / "fx_bad_input.py"
WARNING_ONLY = FIXTURES / "fx_out_of_range_warning.py"
CLEAN = EXAMPLES / "clean_mlp.py"
EPS_UPSTREAM = FIXTURES / "fx_eps_underflow.py"
MODELS = [MATRIX_INVERSE, BAD_INPUT, WARNING_ONLY, CLEAN, EPS_UPSTREAM]


def _scan(path: Path) -> Report:
    """One scan per model for the whole session, timing zeroed (reports are frozen)."""
    return dataclasses.replace(scanned(path), seconds=0.0)


def _sarif(path: Path) -> dict[str, Any]:
    return json.loads(render_sarif(_scan(path)))


def _report(*findings: Finding, file: str = "model.py") -> Report:
    target = ScanTarget(file=file, mode="autocast", dtype="float16", device="cpu", policy="native")
    return Report(target=target, findings=findings, ops=3, backward_nodes=2, propagated=0,
                  seconds=0.0)


def _finding(**changes: Any) -> Finding:
    base = Finding(
        code="NH101",
        severity=Severity.ERROR,
        kind=Kind.OVERFLOW,
        phase=Phase.FORWARD,
        op="torch.matmul",
        module="",
        location=SourceLocation(file="model.py", line=7, code="y = a @ b"),
        origin=True,
        message="boom",
    )
    return dataclasses.replace(base, **changes)


# --- golden files ------------------------------------------------------------------------------

GOLDEN_CASES = [
    *((MATRIX_INVERSE, fmt) for fmt in EXTENSIONS),
    *((EPS_UPSTREAM, fmt) for fmt in EXTENSIONS),
    (BAD_INPUT, "sarif"),
    (BAD_INPUT, "github"),
    (WARNING_ONLY, "markdown"),
    (WARNING_ONLY, "junit"),
    (CLEAN, "markdown"),
]


@pytest.mark.parametrize(
    ("path", "fmt"), GOLDEN_CASES, ids=[f"{p.stem}.{f}" for p, f in GOLDEN_CASES]
)
def test_golden_emitter(path: Path, fmt: str, update_golden: bool) -> None:
    rendered = render(_scan(path), fmt)
    if fmt == "sarif":  # rule docs change on their own; the rules test checks them in full
        data = json.loads(rendered)
        driver = data["runs"][0]["tool"]["driver"]
        driver["rules"] = [{"id": rule["id"]} for rule in driver["rules"]]
        rendered = json.dumps(data, indent=2) + "\n"
    golden = EMITTER_GOLDEN / f"{path.stem}.{EXTENSIONS[fmt]}"
    if update_golden or not golden.exists():
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered, encoding="utf-8")
        if not update_golden:
            pytest.fail(f"{golden.name} did not exist; written now, check it in")
    assert rendered == golden.read_text(encoding="utf-8")


def test_formats_match_the_cli_choices() -> None:
    assert [member.value for member in OutputFormat] == list(FORMATS)
    with pytest.raises(ValueError, match="unknown format 'yaml'"):
        render(_report(), "yaml")


# --- SARIF -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sarif_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SARIF_SCHEMA_FILE.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_sarif_validates_against_the_official_schema(
    path: Path, sarif_validator: jsonschema.protocols.Validator
) -> None:
    data = _sarif(path)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in sarif_validator.iter_errors(data)]
    assert errors == []
    assert data["version"] == "2.1.0"
    assert data["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"


def test_sarif_of_handmade_edge_cases_validates(
    sarif_validator: jsonschema.protocols.Validator,
) -> None:
    report = _report(
        _finding(module="encoder.layers.0", fix=Fix("t", Applicability.UNSAFE, None)),
        _finding(code="NH999", severity=Severity.INFO, location=None, message="?"),
    )
    data = json.loads(render_sarif(report))
    assert list(sarif_validator.iter_errors(data)) == []
    first, unknown = data["runs"][0]["results"]
    assert first["locations"][0]["logicalLocations"] == [
        {"name": "0", "fullyQualifiedName": "encoder.layers.0", "kind": "module"}
    ]
    assert "fixes" not in first  # no diff: the fix is a property only
    assert first["properties"]["fix"] == {"title": "t", "applicability": "unsafe"}
    assert "ruleIndex" not in unknown and unknown["level"] == "note"
    assert "locations" not in unknown


def test_sarif_rules_cover_the_registry_and_rule_index_points_at_them() -> None:
    run = _sarif(MATRIX_INVERSE)["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    registered = all_rules()
    assert [r["id"] for r in rules] == [r.code for r in registered]
    levels = {"error": "error", "warning": "warning", "info": "note"}
    for entry, rule in zip(rules, registered, strict=True):
        assert entry["name"] == rule.name
        assert entry["shortDescription"]["text"] == rule.summary
        assert entry["fullDescription"] == {"text": rule.doc, "markdown": rule.doc}
        assert entry["help"] == {"text": rule.doc, "markdown": rule.doc}
        assert entry["defaultConfiguration"]["level"] == levels[rule.severity.value]
    for path in MODELS:
        for result in _sarif(path)["runs"][0]["results"]:
            assert rules[result["ruleIndex"]]["id"] == result["ruleId"]


def test_sarif_results_of_the_examples() -> None:
    (result,) = _sarif(MATRIX_INVERSE)["runs"][0]["results"]
    assert (result["ruleId"], result["level"]) == ("NH101", "error")
    (location,) = result["locations"]
    assert location["physicalLocation"] == {
        "artifactLocation": {"uri": "examples/matrix_inverse.py", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 46, "snippet": {"text": "codes = torch.matmul(dtd_inv, z)"}},
    }
    assert "logicalLocations" not in location  # the root module has an empty path
    props = result["properties"]
    assert (props["kind"], props["phase"], props["op"], props["origin"]) == (
        "overflow", "forward", "torch.matmul", True
    )
    assert props["fp32_rerun"]["finite"] is True

    (bad,) = _sarif(BAD_INPUT)["runs"][0]["results"]
    assert bad["ruleId"] == "NH001" and "locations" not in bad and "fixes" not in bad

    (warning,) = _sarif(WARNING_ONLY)["runs"][0]["results"]
    assert (warning["ruleId"], warning["level"]) == ("NH501", "warning")

    assert _sarif(CLEAN)["runs"][0]["results"] == []

    (eps,) = _sarif(EPS_UPSTREAM)["runs"][0]["results"]
    (related,) = eps["relatedLocations"]
    assert related["physicalLocation"]["region"]["startLine"] == 28
    assert eps["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == "norm"


def _offset(line_starts: list[int], line: int, column: int) -> int:
    """SARIF line/column (1-based, code points as declared by ``columnKind``) to an offset."""
    return line_starts[line - 1] + column - 1


def _apply_sarif(text: str, replacements: list[dict[str, Any]]) -> str:
    """Apply SARIF replacements whose regions refer to ``text``, the original file."""
    line_starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
    edits = []
    for replacement in replacements:
        region = replacement["deletedRegion"]
        start_line = region["startLine"]
        start = _offset(line_starts, start_line, region.get("startColumn", 1))
        end = _offset(line_starts, region.get("endLine", start_line), region["endColumn"])
        edits.append((start, end, replacement.get("insertedContent", {}).get("text", "")))
    edits.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(edits)), "replacements overlap"
    for start, end, new in reversed(edits):
        text = text[:start] + new + text[end:]
    return text


def _git_apply(original: Path, diff: str, work: Path, *options: str, rel: str = "") -> str:
    """Apply ``diff`` in a new repository holding ``original`` at ``rel`` (its name by
    default), as a user applies a patch from the project root."""
    target = work / (rel or original.name)
    target.parent.mkdir(parents=True)
    shutil.copy(original, target)
    (work / "fix.patch").write_bytes(diff.encode("utf-8"))
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run(["git", "apply", *options, "fix.patch"], cwd=work, check=True)
    return target.read_bytes().decode("utf-8")


@pytest.mark.parametrize("path", [MATRIX_INVERSE, EPS_UPSTREAM], ids=lambda p: p.stem)
def test_sarif_fix_equals_git_apply_of_the_diff(path: Path, tmp_path: Path) -> None:
    finding = _scan(path).findings[0]
    assert finding.fix is not None and finding.fix.diff is not None
    result = _sarif(path)["runs"][0]["results"][0]
    (fix,) = result["fixes"]
    assert fix["description"]["text"] == finding.fix.title
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"] == path.relative_to(ROOT).as_posix()
    rel = path.relative_to(ROOT).as_posix()
    patched = _git_apply(path, finding.fix.diff, tmp_path / "git", rel=rel)
    original = path.read_bytes().decode("utf-8")
    assert patched != original
    assert _apply_sarif(original, change["replacements"]) == patched


_BODY = "".join(f"x{i} = {i}\n" for i in range(1, 21))
EDITS = {
    "two-hunks": (_BODY, "import torch\n" + _BODY.replace("x15 = 15\n", "x15 = 15.0\n")),
    "last-line": (_BODY, _BODY.replace("x20 = 20\n", "x20 = 0\n")),
    "no-final-newline": (_BODY + "last = 1", _BODY + "last = 2"),
    "add-final-newline": (_BODY + "last = 1", _BODY + "last = 1\n"),
    "crlf": (_BODY.replace("\n", "\r\n"), _BODY.replace("\n", "\r\n").replace("x3 ", "y3 ")),
    "pure-insert-and-delete": (
        _BODY, _BODY.replace("x4 = 4\n", "x4 = 4\nnew = 0\nnew2 = 0\n").replace("x9 = 9\n", "")
    ),
    "insert-at-top": (_BODY, "# header\n" + _BODY),
    "non-ascii": ("a = 'é'\nb = 'ü'", "a = 'é'\nb = 'ö'"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_sarif_replacements_the_diff_and_the_edits_agree(case: str, tmp_path: Path) -> None:
    old, new = EDITS[case]
    source = tmp_path / "model.py"
    source.write_bytes(old.encode("utf-8"))
    edits = edits_between(source, old, new)
    fix = make_fix("edit", Applicability.SAFE, edits, tmp_path)
    assert fix.diff is not None and fix.diff.startswith("--- a/model.py\n+++ b/model.py\n")
    assert apply_edits(old, edits) == new
    report = _report(
        _finding(
            location=SourceLocation(str(source), 1, "x1 = 1"),
            fix=fix,
        ),
        file=str(source),
    )
    (change,) = json.loads(render_sarif(report))["runs"][0]["results"][0]["fixes"][0][
        "artifactChanges"
    ]
    # Outside the working directory the artifact is an absolute file: URI, with no base id.
    assert change["artifactLocation"] == {"uri": source.resolve().as_uri()}
    assert _git_apply(source, fix.diff, tmp_path / "git") == new
    assert _apply_sarif(old, change["replacements"]) == new


# --- GitHub Actions ----------------------------------------------------------------------------


def test_github_lines_for_matrix_inverse() -> None:
    assert render_github(_scan(MATRIX_INVERSE)).splitlines() == [
        "::error file=examples/matrix_inverse.py,line=46,title=NH101 overflow::"
        "torch.matmul receives an FP32 operand with |x| up to 3.09e+05, above the float16 "
        "maximum 6.55e+04; autocast casts it to float16 and the output gets 8 NaN",
        "nan-hunter: 1 error, 0 warnings in examples/matrix_inverse.py",
    ]


def test_github_other_severities_and_no_location() -> None:
    lines = render_github(_scan(BAD_INPUT)).splitlines()
    assert lines[0].startswith("::error title=NH001 bad_input::input args[0] contains")
    lines = render_github(_scan(WARNING_ONLY)).splitlines()
    line = marker_line(WARNING_ONLY, "# <- culprit")
    assert lines[0].startswith(
        f"::warning file=tests/fixtures/fx_out_of_range_warning.py,line={line},"
        "title=NH501 out_of_range::torch.exp produces"
    )
    assert lines[1] == (
        "nan-hunter: 0 errors, 1 warning in tests/fixtures/fx_out_of_range_warning.py"
    )
    assert render_github(_scan(CLEAN)) == (
        "nan-hunter: 0 errors, 0 warnings in examples/clean_mlp.py\n"
    )
    info = _report(_finding(severity=Severity.INFO, location=None, message="fyi"))
    assert render_github(info).splitlines()[0] == "::notice title=NH101 overflow::fyi"


def test_github_escaping() -> None:
    finding = _finding(
        location=SourceLocation(file="dir:a,b/m%.py", line=3, code="x"),
        message="100% sure:\r\nline two, a:b",
    )
    first, summary = render_github(_report(finding, file="dir:a,b/m%.py")).splitlines()
    assert first == (
        "::error file=dir%3Aa%2Cb/m%25.py,line=3,title=NH101 overflow::"
        "100%25 sure:%0D%0Aline two, a:b"
    )
    assert not summary.startswith("::")


# --- JUnit -------------------------------------------------------------------------------------


def _junit(report: Report) -> ET.Element:
    return ET.fromstring(render_junit(report))


def test_junit_failure_for_errors() -> None:
    suite = _junit(_scan(MATRIX_INVERSE))
    assert suite.tag == "testsuite"
    assert (suite.get("name"), suite.get("tests"), suite.get("failures"), suite.get("errors")) == (
        "nan-hunter", "1", "1", "0"
    )
    (case,) = suite.findall("testcase")
    assert (case.get("classname"), case.get("name")) == ("nan-hunter", "examples/matrix_inverse.py")
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "NH101"
    assert failure.get("message", "").startswith("1 error: torch.matmul receives")
    assert (failure.text or "").splitlines() == [
        "examples/matrix_inverse.py:46: NH101 error " + _scan(MATRIX_INVERSE).findings[0].message
    ]


def test_junit_lists_every_finding_and_counts_errors() -> None:
    report = _report(
        _finding(message="first"),
        _finding(code="NH301", message="second", location=None),
        _finding(code="NH501", severity=Severity.WARNING, message="third"),
    )
    failure = _junit(report).find("testcase/failure")
    assert failure is not None
    assert failure.get("message") == "2 errors: first"
    assert (failure.text or "").splitlines() == [
        "model.py:7: NH101 error first",
        "model.py: NH301 error second",
        "model.py:7: NH501 warning third",
    ]


def test_junit_clean_and_warnings_only_pass() -> None:
    for path in (CLEAN, WARNING_ONLY):
        suite = _junit(_scan(path))
        assert suite.get("failures") == "0"
        assert suite.find("testcase/failure") is None
    out = _junit(_scan(WARNING_ONLY)).find("testcase/system-out")
    assert out is not None and "NH501 warning torch.exp" in (out.text or "")
    assert _junit(_scan(CLEAN)).find("testcase/system-out") is None


def test_junit_survives_characters_xml_cannot_hold() -> None:
    failure = _junit(_report(_finding(message="bad \x00 byte <&>"))).find("testcase/failure")
    assert failure is not None and failure.get("message") == "1 error: bad \\x00 byte <&>"


# --- Markdown ----------------------------------------------------------------------------------


def test_markdown_has_the_diff_block_and_stats_table() -> None:
    report = _scan(MATRIX_INVERSE)
    text = render_markdown(report)
    t = report.target
    assert text.startswith(
        f"# nan-hunter: `examples/matrix_inverse.py` ({t.mode}, {t.dtype}, {t.device}, "
        f"policy {t.policy}, GradScaler 2\\*\\*16, dynamic): findings\n"
    )
    assert "## NH101 · overflow · `examples/matrix_inverse.py:46`" in text
    assert "| tensor | shape | dtype | min | max | NaN | +inf | -inf |" in text
    assert "| out[0] | [32, 4] | float16 | -4.051 | 3.826 | 8 | 0 | 0 |" in text
    assert (
        "```diff\n--- a/examples/matrix_inverse.py\n+++ b/examples/matrix_inverse.py\n"
        "@@ -43,7 +43,8 @@"
    ) in text
    assert "- **fix** (safe): Run torch.matmul" in text
    assert text.rstrip().endswith("1 propagated, 0.00 s")


def test_markdown_escapes_tables_markup_and_backticks() -> None:
    report = _report(
        _finding(
            location=SourceLocation("model.py", 7, "y = f`a` | b"),
            message="Tensor.__add__ [x] |y|",
            fix=Fix("f", Applicability.SAFE, diff="```\n+x\n"),
        ),
        _finding(code="NH501", severity=Severity.WARNING, message="a | b"),
    )
    text = render_markdown(report)
    assert "Tensor.\\_\\_add\\_\\_ \\[x\\] |y|" in text
    assert "- **code:** ``y = f`a` | b``" in text
    assert "````diff\n```\n+x\n````" in text
    assert "| NH501 | `model.py:7` | a \\| b |" in text


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_sarif_and_github_formats() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["scan", str(MATRIX_INVERSE), "--format", "sarif"],
                           env={"COLUMNS": "100"})
    assert result.exit_code == 1
    assert json.loads(result.stdout)["runs"][0]["results"][0]["ruleId"] == "NH101"
    result = runner.invoke(app, ["scan", str(MATRIX_INVERSE), "--format", "github"],
                           env={"COLUMNS": "100"})
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0].startswith(
        "::error file=examples/matrix_inverse.py,line=46,"
    )
