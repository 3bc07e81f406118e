"""The command line's own process never imports torch: only its scan process does.

The report comes back from the scan process pickled, and rendering it (text, JSON, Markdown,
JUnit, GitHub annotations, SARIF, diffs) needs only torch-free modules (``trace.summary``,
``precision.scale_window``, SARIF's rule descriptions from ``report/rules.json``); before, the
parent imported torch before it even started the scan process, adding a torch import (1.2 s of
3.7 s on ``examples/matrix_inverse.py``) to the wall time of every run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_PROGRAM = """
import sys
from typer.testing import CliRunner
from nan_hunter.cli import app

runner = CliRunner()
codes = []
for args in sys.argv[1:]:
    result = runner.invoke(app, ["scan", *args.split()])
    codes.append(result.exit_code)
    assert result.stdout.strip(), (args, result.stderr)
print("torch imported" if "torch" in sys.modules else "no torch", *codes)
"""


@pytest.mark.slow
def test_rendering_a_report_does_not_import_torch_in_the_command_line_process() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NAN_HUNTER_IN_PROCESS"}
    env["PYTHONPATH"] = str(ROOT)
    culprit = "tests/fixtures/fx_mul_overflow.py"
    runs = [
        f"{culprit}",
        f"{culprit} --format json",
        f"{culprit} --format markdown --diff",
        "tests/fixtures/fx_clean.py --format junit",
        f"{culprit} --format sarif",
    ]
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, *runs],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = ["no", "torch", "1", "1", "1", "0", "1"]
    assert done.stdout.split() == expected, done.stdout + done.stderr
