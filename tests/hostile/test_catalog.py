"""Runs every case of ``tests/hostile/cases.py``: exit code, the one error line, and every file in
the working folder byte-identical afterwards except those the user named."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.process.isolation import IN_PROCESS_ENV
from tests.hostile.cases import CASES, Case
from tests.hostile.conftest import snapshot

runner = CliRunner()


def test_the_catalog_is_large_and_names_are_unique() -> None:
    assert len(CASES) >= 158
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    "case",
    # a case in the real scan process costs a torch import (~2-4 s): behind the slow marker
    [pytest.param(c, marks=pytest.mark.slow if c.child else ()) for c in CASES],
    ids=[c.name for c in CASES],
)
def test_case(case: Case, work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if case.root and os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    for name, content in case.files.items():
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    if case.child:
        monkeypatch.delenv(IN_PROCESS_ENV, raising=False)
    else:
        monkeypatch.setenv(IN_PROCESS_ENV, "1")
    if case.setup is not None:
        case.setup(work, monkeypatch)
    before = snapshot(work)

    result = runner.invoke(app, list(case.args), env={"COLUMNS": "100"})

    detail = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.exit_code == case.code, detail
    assert result.exception is None or isinstance(result.exception, SystemExit), detail
    assert "Traceback" not in result.stdout + result.stderr, detail
    errors = [line for line in result.stderr.splitlines() if line.startswith("nan-hunter: error")]
    if case.code == 2:
        assert case.error is not None
        assert len(errors) == 1, detail
        assert result.stderr.startswith("nan-hunter: error: "), detail
        if case.alone:
            assert result.stderr.count("\n") == 1, detail
        assert re.search(case.error, errors[0]), errors[0]
    else:
        assert errors == [], detail
    after = snapshot(work)
    changed = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
    assert changed <= case.written, f"changed unexpectedly: {sorted(changed - case.written)}"
    if case.check is not None:
        case.check(work, result)
