"""``-o -``, the usual spelling of "standard output" (``nan-hunter scan models
--format sarif -o - | ...``). Before, it wrote the report to a file named ``-`` in the
working folder and left stdout empty. Now ``-o -`` is stdout, as without ``-o``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from nan_hunter.cli import app
from tests.conftest import EXAMPLES


def test_output_dash_is_stdout(work: Path) -> None:
    shutil.copy(EXAMPLES / "matrix_inverse.py", work / "model.py")
    result = CliRunner().invoke(app, ["scan", "model.py", "-q", "--format", "json", "-o", "-"])
    assert result.exit_code == 1, result.stderr
    assert json.loads(result.stdout)["status"] == "findings"
    assert "report written" not in result.stderr
    assert sorted(p.name for p in work.iterdir()) == ["model.py"]
