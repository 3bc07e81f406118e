"""A model file that turns on ``torch.autograd.set_detect_anomaly(True)`` (what users
do first when hunting a NaN). Before, the scan's own FP16 backward, whose NaN gradients are
what the scan is there to analyse, raised autograd's anomaly error, and the scan ended with
"the model raised RuntimeError during backward: Function 'AddmmBackward0' returned nan
values in its 2th output" (exit 2) and a page of anomaly-mode traceback. Now anomaly detection
is off during the scan's passes and restored after, as the user set it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.conftest import EXAMPLES, FIXTURES

ON = "import torch\ntorch.autograd.set_detect_anomaly(True)\n"


def _with_anomaly(source: Path, work: Path) -> Path:
    text = source.read_text(encoding="utf-8")
    assert "import torch\n" in text
    path = work / source.name
    path.write_text(text.replace("import torch\n", ON, 1), encoding="utf-8")
    return path


def test_backward_finding_with_anomaly_detection_on(work: Path) -> None:
    path = _with_anomaly(FIXTURES / "fx_backward_inf.py", work)
    result = CliRunner().invoke(app, ["scan", path.name, "-q", "--format", "json"])
    assert result.exit_code == 1, result.stderr
    data = json.loads(result.stdout)
    assert [(f["code"], f["phase"]) for f in data["findings"]] == [("NH401", "backward")]


def test_forward_finding_is_fixed_with_anomaly_detection_on(work: Path) -> None:
    path = _with_anomaly(EXAMPLES / "matrix_inverse.py", work)
    result = CliRunner().invoke(app, ["scan", path.name, "-q", "--fix", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "clean"
    assert "fixed NH101" in result.stderr


def test_the_users_anomaly_mode_is_restored() -> None:
    from nan_hunter.api import scan_file

    with torch.autograd.set_detect_anomaly(True, check_nan=True):
        report = scan_file(str(FIXTURES / "fx_backward_inf.py"), verify=False)
        assert torch.is_anomaly_enabled() and torch.is_anomaly_check_nan_enabled()
    assert [f.code for f in report.findings] == ["NH401"]


@pytest.mark.slow
def test_steps_find_the_breaking_step_with_anomaly_detection_on(work: Path) -> None:
    """Before: 'RuntimeError in the backward of training step 11: Function
    'AddmmBackward0' returned nan values in its 0th output.' (exit 2)."""
    path = _with_anomaly(EXAMPLES / "training_loop_watch.py", work)
    result = CliRunner().invoke(
        app, ["scan", path.name, "-q", "--steps", "20", "--lr", "0.5", "--format", "json"]
    )
    assert result.exit_code == 1, result.stderr
    assert "nan-hunter: trained 12 step(s); step 11 broke: the loss is nan" in result.stderr
    assert json.loads(result.stdout)["status"] == "findings"
