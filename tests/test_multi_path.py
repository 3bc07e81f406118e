"""Several paths in one run: files and folders, one combined report, the highest exit code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.project.targets import defines, expand_paths
from nan_hunter.report.combined import SCHEMA
from tests.conftest import EXAMPLES, FIXTURES, ROOT
from tests.test_report_emitters import SARIF_SCHEMA_FILE

runner = CliRunner()
CLEAN = str(EXAMPLES / "clean_mlp.py")
BROKEN = str(EXAMPLES / "matrix_inverse.py")  # one NH101 error
WARNING_ONLY = str(FIXTURES / "fx_out_of_range_warning.py")
REPORT_DIR = ROOT / "nan_hunter" / "report"


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "100"})
    return result.exit_code, result.stdout, result.stderr


def _folder(tmp_path: Path) -> Path:
    """models/ with two model files, a helper without build_model, a venv and a hidden folder."""
    root = tmp_path / "models"
    (root / "sub").mkdir(parents=True)
    shutil.copy(EXAMPLES / "clean_mlp.py", root / "a_clean.py")
    shutil.copy(EXAMPLES / "matrix_inverse.py", root / "sub" / "b_inverse.py")
    (root / "helpers.py").write_text("def build_layer():\n    return 1\n", encoding="utf-8")
    for skipped in (".hidden", "venv"):
        (root / skipped).mkdir()
        shutil.copy(EXAMPLES / "clean_mlp.py", root / skipped / "model.py")
    (root / "venv" / "pyvenv.cfg").write_text("home = /usr\n", encoding="utf-8")
    return root


def test_folder_expands_to_files_defining_the_model(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    assert expand_paths([str(root)], "build_model") == [
        str(root / "a_clean.py"), str(root / "sub" / "b_inverse.py")
    ]
    assert expand_paths([str(root), str(root / "a_clean.py")], "build_model")[-1].endswith(
        "b_inverse.py"
    )  # no duplicates
    assert expand_paths([str(root)], "build_layer") == [str(root / "helpers.py")]
    (root / "broken.py").write_text("def build_model(:\n", encoding="utf-8")
    assert defines(root / "broken.py", "build_model")  # kept, so its error is reported


def test_folder_without_models_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("y = 1\n", encoding="utf-8")
    code, out, err = invoke("scan", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == (
        f"nan-hunter: error: {tmp_path}: no .py file below this folder defines build_model()\n"
    )


def test_text_report_of_two_files_and_the_highest_exit_code() -> None:
    code, out, _ = invoke("scan", CLEAN, BROKEN, "--no-verify")
    assert code == 1
    assert out.index("nan-hunter examples/clean_mlp.py") < out.index(
        "nan-hunter examples/matrix_inverse.py"
    )
    assert "error[NH101]" in out
    assert out.splitlines()[-1] == (
        "total: 2 files: 1 with findings, 1 clean, 0 failed, 1 error, 0 warnings"
    )
    assert invoke("scan", CLEAN, WARNING_ONLY)[0] == 0
    assert invoke("scan", CLEAN, WARNING_ONLY, "--fail-on", "warning")[0] == 1
    assert invoke("scan", CLEAN, BROKEN, "--no-verify", "--exit-zero")[0] == 0


def test_json_shape_of_a_multi_path_run(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.py")
    code, out, err = invoke("scan", BROKEN, missing, CLEAN, "--no-verify", "--format", "json")
    assert code == 2  # a file that could not be scanned outranks findings
    assert err.startswith(f"nan-hunter: error: {missing}: ")
    data = json.loads(out)
    assert data["schema"] == SCHEMA
    assert data["status"] == "error"
    assert [r["target"]["file"] for r in data["reports"]] == [
        "examples/matrix_inverse.py", "examples/clean_mlp.py"
    ]
    jsonschema.validate(data, json.loads((REPORT_DIR / "reports.schema.json").read_text()))
    schema = json.loads((REPORT_DIR / "report.schema.json").read_text())
    for report in data["reports"]:
        jsonschema.validate(report, schema)
    assert [f["path"] for f in data["failed"]] == [missing]
    assert data["summary"] == {
        "files": 3, "scanned": 2, "failed": 1, "errors": 1, "warnings": 0, "suppressed": 0
    }


def test_sarif_of_a_folder_is_one_valid_run(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    code, out, _ = invoke("scan", str(root), "--no-verify", "--format", "sarif")
    assert code == 1
    data = json.loads(out)
    schema = json.loads(SARIF_SCHEMA_FILE.read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert [e.message for e in validator.iter_errors(data)] == []
    (run,) = data["runs"]
    assert [r["ruleId"] for r in run["results"]] == ["NH101"]


def test_junit_github_markdown_of_two_files() -> None:
    junit = invoke("scan", CLEAN, BROKEN, "--no-verify", "--format", "junit")[1]
    assert 'tests="2" failures="1" errors="0"' in junit
    assert junit.count("<testcase ") == 2
    github = invoke("scan", CLEAN, BROKEN, "--no-verify", "--format", "github")[1].splitlines()
    assert github[0] == "nan-hunter: 0 errors, 0 warnings in examples/clean_mlp.py"
    assert github[1].startswith("::error file=examples/matrix_inverse.py,line=")
    github = invoke("scan", CLEAN, "no such%file.py", "--format", "github")[1].splitlines()
    assert github[-1].startswith("::error title=nan-hunter::no such%25file.py: ")
    markdown = invoke("scan", CLEAN, BROKEN, "--no-verify", "--format", "markdown")[1]
    assert markdown.count("# nan-hunter: ") == 2
    assert markdown.rstrip().endswith("**Total:** total: 2 files: 1 with findings, 1 clean, "
                                      "0 failed, 1 error, 0 warnings")


def test_single_path_output_is_unchanged_by_multi_path_support() -> None:
    """One path: the single-report emitters, byte for byte (goldens in test_report_formats)."""
    from nan_hunter.api import scan_file
    from nan_hunter.report import render

    for fmt in ("json", "sarif", "github", "junit", "markdown"):
        code, out, _ = invoke("scan", CLEAN, "--format", fmt)
        assert code == 0
        expected = render(scan_file(CLEAN), fmt)
        if fmt in ("json", "junit", "markdown"):  # both hold the scan's duration
            out, expected = _no_time(out), _no_time(expected)
        assert out == expected, fmt


def test_diff_and_patch_take_one_file(tmp_path: Path) -> None:
    code, out, err = invoke("scan", CLEAN, BROKEN, "--diff")
    assert (code, out) == (2, "")
    assert err == "nan-hunter: error: --diff and --patch take one model file, not several\n"


def _no_time(text: str) -> str:
    import re

    return re.sub(r'(seconds": |time=")[0-9.]+|in [0-9.]+s|[0-9.]+ s\b', "T", text)
