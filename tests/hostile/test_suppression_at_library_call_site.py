"""A finding whose op runs inside an installed library (transformers' attention,
here a tiny stand-in in a site-packages folder) has its location in the library and a
``call_site`` in the user's file, where its fix goes. Before, a suppression comment could
only be on the location's line, a file the user does not own: ``# nan-hunter: ignore[NH102]
-- ...`` on the call-site line was ignored, the finding stayed an error (exit 1) and the only
way out was ``--ignore NH102`` for the whole project. Now the call-site line suppresses it."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nan_hunter.api import scan_file
from nan_hunter.report import render
from tests.conftest import FIXTURES

PROJECTS = FIXTURES / "projects"


@pytest.fixture(autouse=True)
def _fresh_library() -> Iterator[None]:
    """Each test imports nh_tinylib from its own copy; none is left for the next test."""
    sys.modules.pop("nh_tinylib", None)
    yield
    sys.modules.pop("nh_tinylib", None)

CALL = "        g = nh_tinylib.gram(h)  # <- call site\n"


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, comment: str) -> Path:
    site = tmp_path / "venv" / "site-packages"
    shutil.copytree(PROJECTS / "site-packages", site)
    monkeypatch.syspath_prepend(str(site))
    root = tmp_path / "lib_user"
    shutil.copytree(PROJECTS / "lib_user", root)
    model = root / "model.py"
    text = model.read_text(encoding="utf-8")
    assert CALL in text
    model.write_text(text.replace(CALL, CALL.replace("# <- call site", comment)), "utf-8")
    return model


def test_a_library_finding_is_suppressed_at_its_call_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _project(tmp_path, monkeypatch, "# nan-hunter: ignore[NH102] -- inputs are bounded")
    report = scan_file(str(model), verify=False)
    (finding,) = report.findings
    assert finding.location is not None and "site-packages" in finding.location.file
    assert finding.suppression is not None
    assert (finding.suppression.reason, finding.suppression.file, finding.suppression.line) == (
        "inputs are bounded", str(model), 15
    )
    assert report.errors == 0 and report.exit_code("error") == 0
    data = json.loads(render(report, "json"))
    assert data["findings"][0]["suppressed"] is True


def test_a_call_site_comment_without_a_reason_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _project(tmp_path, monkeypatch, "# nan-hunter: ignore[NH102]")
    report = scan_file(str(model), verify=False)
    (finding,) = report.findings
    assert finding.suppression is None and report.errors == 1
    (note,) = report.target.notes
    assert note.startswith(f"{model}:15: ignore[NH102] has no reason")
