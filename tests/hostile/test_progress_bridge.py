"""The scan process: its steps reach the progress display (the note board); --debug shows the
traceback of an internal error inside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nan_hunter.process.isolation import IN_PROCESS_ENV, run_isolated
from nan_hunter.process.scan_process import ScanJob, scan_job
from nan_hunter.project.config import load_settings
from tests.hostile.cases import model


def test_steps_of_the_scan_process_reach_on_step(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(IN_PROCESS_ENV, raising=False)
    (work / "model.py").write_text(model(build="import time\ntime.sleep(1)"))
    job = ScanJob(path="model.py", settings=load_settings(), rounds=1)
    steps: list[str] = []
    isolated = run_isolated(scan_job, job, on_step=steps.append)
    assert isolated.value.errors == 0
    assert "calling build_model()" in steps
    assert str(work / "model.py") in isolated.imported


def test_debug_shows_the_traceback_of_an_internal_error(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from nan_hunter.cli import app
    from tests.hostile.cases import BREAKS_NAN_HUNTER

    monkeypatch.delenv(IN_PROCESS_ENV, raising=False)
    (work / "model.py").write_text(model(top=BREAKS_NAN_HUNTER))
    result = CliRunner().invoke(app, ["scan", "model.py", "--debug"])
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "ZeroDivisionError: division by zero" in result.stderr


def test_the_scan_process_imports_no_command_line_libraries(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """typer (with pydantic), rich and markdown-it cost the scan process time on every scan and
    do nothing there: the job runs from ``nan_hunter.process.scan_process``, which imports none of
    them."""
    monkeypatch.delenv(IN_PROCESS_ENV, raising=False)
    build = (
        "import sys\n"
        "seen = [m for m in ('typer', 'rich', 'pydantic', 'markdown_it') if m in sys.modules]\n"
        "open('seen.txt', 'w').write(','.join(seen) or 'none')\n"
    )
    (work / "model.py").write_text(model(build=build))
    job = ScanJob(path="model.py", settings=load_settings(), rounds=1)
    isolated = run_isolated(scan_job, job)
    assert isolated.value.errors == 0
    assert (work / "seen.txt").read_text() == "none"
