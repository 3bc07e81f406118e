"""The scan process's notes (``--fix``, ``--fix-all``, ``--steps``) when the model's code closed or
replaced ``sys.stderr``: the report and exit code survive, and the note is still shown (before
the note's write raised in the scan process: a file already fixed, and the scan ended in
"internal error: ValueError: I/O operation on closed file" with no report)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.process.isolation import IN_PROCESS_ENV
from nan_hunter.process.scan_process import _say
from tests.hostile.cases import MATRIX

BREAKS_STDERR = {
    "closed": "import sys as _sys\n_sys.stderr.close()\n",
    "none": "import sys as _sys\n_sys.stderr = None\n",
    "raising": (
        "import sys as _sys\n"
        "class _Raises:\n"
        "    def write(self, text):\n"
        "        raise OSError('no')\n"
        "    def flush(self):\n"
        "        raise OSError('no')\n"
        "_sys.stderr = _Raises()\n"
    ),
}


@pytest.mark.parametrize("how", sorted(BREAKS_STDERR))
def test_a_fix_note_survives_a_broken_stderr(
    work: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.delenv(IN_PROCESS_ENV, raising=False)
    (work / "model.py").write_text(MATRIX + "\n" + BREAKS_STDERR[how])
    result = CliRunner().invoke(app, ["scan", "model.py", "--fix", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["errors"] == 0
    assert "nan-hunter: fixed NH101 in " in result.stderr
    assert "torch.autocast" in (work / "model.py").read_text()


def test_a_note_never_goes_to_stdout(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``sys.stderr = None``: ``print(file=None)`` would write to stdout, the report's stream
    when the job runs in the CLI's own process (``NAN_HUNTER_IN_PROCESS=1``)."""
    monkeypatch.setattr(sys, "stderr", None)
    _say("nan-hunter: fixed NH101 in model.py")
    out, err = capfd.readouterr()
    assert (out, err) == ("", "nan-hunter: fixed NH101 in model.py\n")
