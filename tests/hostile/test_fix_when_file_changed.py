"""The model file changes between the scan and ``--fix`` (the user saves it in an
editor while the scan, or its fixes' verification, runs). Before, the fix's edits (offsets
into the text as scanned) were applied to whatever was on disk: two lines added at the top
moved every offset, and ``--fix`` wrote a file with the fix spliced into the middle of another
line (``eye = torch.eye(N_ATOMS        with torch.autocast(...``), said "fixed NH101", and the
re-scan failed with a syntax error. Now nothing is written: one line, exit 2, the file is the
user's version byte for byte and no backup is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.errors import NanHunterError
from nan_hunter.findings import Edit
from nan_hunter.fixes.edits import edits_between, patch_files
from tests.conftest import EXAMPLES

EDIT = "# edited by the user while the scan ran\n# a second line\n"


def _model(work: Path) -> Path:
    """matrix_inverse.py whose build_model(), when it runs in the verification's patched copy,
    edits the user's file: a save that lands after the scan planned its fixes."""
    path = work / "model.py"
    src = (EXAMPLES / "matrix_inverse.py").read_text(encoding="utf-8")
    head = "def build_model() -> nn.Module:\n"
    assert head in src
    src = src.replace(head, head + (
        "    import os\n"
        f"    original = {str(path)!r}\n"
        "    if os.path.realpath(__file__) != original:\n"
        "        text = open(original).read()\n"
        "        if not text.startswith('# edited'):\n"
        f"            open(original, 'w').write({EDIT!r} + text)\n"
    ))
    path.write_text(src, encoding="utf-8")
    return path


def test_fix_refuses_a_file_changed_since_the_scan(work: Path) -> None:
    path = _model(work)
    before = path.read_text(encoding="utf-8")
    result = CliRunner().invoke(app, ["scan", "model.py", "--fix", "-q"], env={"COLUMNS": "100"})
    assert result.exit_code == 2, result.stderr
    assert result.stdout == ""
    first = result.stderr.splitlines()[0]
    assert first.startswith("nan-hunter: error: ")
    assert "model.py changed since the scan" in first
    assert "no fix was written" in first
    assert path.read_text(encoding="utf-8") == EDIT + before  # the user's save, untouched
    assert sorted(p.name for p in work.iterdir()) == ["model.py"]  # no backup


def test_edits_check_the_text_they_were_planned_on(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("a = 1\nb = 2\n")
    (edit,) = edits_between(path, "a = 1\nb = 2\n", "a = 1\nb = 3\n")
    assert patch_files([edit])[path].new_text == "a = 1\nb = 3\n"
    path.write_text("# new\na = 1\nb = 2\n")
    try:
        patch_files([edit])
    except NanHunterError as exc:
        assert str(exc) == f"{path} changed since the scan; no fix was written: scan it again"
    else:
        raise AssertionError("a stale edit was applied")
    # an edit made by hand (no planned text recorded) is applied as before
    assert patch_files([Edit(str(path), 0, 0, "x = 0\n")])[path].new_text.startswith("x = 0\n")


def _edited_after_the_scan(work: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """matrix_inverse.py, saved by the user just after its scan process returned."""
    from nan_hunter.process import isolation

    path = work / "model.py"
    path.write_bytes((EXAMPLES / "matrix_inverse.py").read_bytes())
    scan = isolation.run_isolated

    def then_save(*args: object, **kwargs: object) -> object:
        result = scan(*args, **kwargs)  # type: ignore[arg-type]
        path.write_text(EDIT + path.read_text(encoding="utf-8"), encoding="utf-8")
        return result

    monkeypatch.setattr(isolation, "run_isolated", then_save)
    monkeypatch.setenv("NAN_HUNTER_IN_PROCESS", "1")
    return path


@pytest.mark.parametrize("args", [["--patch", "fix.patch"], ["--diff"]])
def test_patch_and_diff_of_a_file_changed_since_the_scan(
    args: list[str], work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: an uncaught ``EditConflict`` (a traceback), or a patch against the old
    text."""
    path = _edited_after_the_scan(work, monkeypatch)
    before = path.read_bytes()
    result = CliRunner().invoke(app, ["scan", "model.py", "-q", *args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.splitlines()[0] == (
        f"nan-hunter: error: {path} changed since the scan; no fix was written: scan it again"
    )
    assert path.read_bytes() == EDIT.encode() + before  # the user's save, untouched
    assert not (work / "fix.patch").exists()


def test_sarif_leaves_out_the_fixes_of_a_file_changed_since_the_scan(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _edited_after_the_scan(work, monkeypatch)
    result = CliRunner().invoke(app, ["scan", "model.py", "-q", "--format", "sarif"])
    assert result.exit_code == 1, result.output
    (res,) = json.loads(result.stdout)["runs"][0]["results"]
    assert res["ruleId"] == "NH101"
    assert "fixes" not in res  # positions into the old text would point at the wrong lines
