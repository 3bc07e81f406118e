"""SARIF of a run over several model files where one cannot be scanned. Every other
format says so (text "failed:", JSON ``failed``, JUnit an error case, GitHub an error line,
Markdown "Not scanned"); before the SARIF held the other files' results and nothing about
the failure, so code scanning showed a partial run as a complete one. Now the run has an
invocation with ``executionSuccessful: false`` and one error notification per failed file
(SARIF 2.1.0 §3.20), valid against the official schema; a run without failures is unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.conftest import EXAMPLES
from tests.test_report_emitters import SARIF_SCHEMA_FILE

pytestmark = pytest.mark.slow  # a real scan process per file

BAD = """\
import torch


def build_model():
    raise RuntimeError("boom")


def sample_batch():
    return torch.zeros(1)
"""


def test_sarif_of_a_run_with_a_failed_file(work: Path) -> None:
    models = work / "models"
    models.mkdir()
    shutil.copy(EXAMPLES / "matrix_inverse.py", models / "a_matrix.py")
    (models / "b_bad.py").write_text(BAD)
    result = CliRunner().invoke(app, ["scan", "models", "--format", "sarif", "-q"])
    assert result.exit_code == 2
    sarif = json.loads(result.stdout)
    jsonschema.validate(sarif, json.loads(SARIF_SCHEMA_FILE.read_text(encoding="utf-8")))
    (run,) = sarif["runs"]
    assert [r["ruleId"] for r in run["results"]] == ["NH101"]
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    (note,) = invocation["toolExecutionNotifications"]
    assert note["level"] == "error"
    assert note["message"]["text"] == (
        "models/b_bad.py: RuntimeError while calling build_model(): boom "
        f"(at {models / 'b_bad.py'}:5)"
    )
    (where,) = note["locations"]
    assert where["physicalLocation"]["artifactLocation"] == {
        "uri": "models/b_bad.py", "uriBaseId": "%SRCROOT%"
    }
    (models / "b_bad.py").unlink()
    shutil.copy(EXAMPLES / "clean_mlp.py", models / "b_clean.py")
    result = CliRunner().invoke(app, ["scan", "models", "--format", "sarif", "-q"])
    assert result.exit_code == 1
    assert "invocations" not in json.loads(result.stdout)["runs"][0]
