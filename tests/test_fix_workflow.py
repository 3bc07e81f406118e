"""Fixes that are proven: hunk application, verification by re-scan, --fix, --diff, --fix-all."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.config import load_settings
from nan_hunter.findings import Report
from nan_hunter.fixes.apply import PatchConflict, apply_diffs, parse_hunks
from nan_hunter.fixes.workflow import apply_fixes, verify_fixes
from nan_hunter.report.json_report import report_dict
from tests.conftest import EXAMPLES, FIXTURES, PRECISION_FIXES

ORIGINAL = "a\nb\nc\nd\ne\nf\ng\nh\n"
DIFF_B = "--- a/x.py\n+++ b/x.py\n@@ -2,1 +2,1 @@\n-b\n+B\n"
DIFF_G = "--- a/x.py\n+++ b/x.py\n@@ -6,2 +6,3 @@\n f\n-g\n+G\n+G2\n"
DIFF_B_OVERLAP = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n+beta\n"
INSERT_TOP = "--- a/x.py\n+++ b/x.py\n@@ -0,0 +1 @@\n+import torch\n"


def test_hunks_of_several_diffs_apply_together_bottom_up() -> None:
    assert apply_diffs(ORIGINAL, [DIFF_B, DIFF_G]) == "a\nB\nc\nd\ne\nf\nG\nG2\nh\n"
    # the same insertion from two fixes is applied once
    assert apply_diffs(ORIGINAL, [INSERT_TOP, INSERT_TOP, DIFF_B]).startswith(
        "import torch\na\nB\n"
    )


def test_overlapping_or_stale_hunks_are_refused() -> None:
    with pytest.raises(PatchConflict, match="overlapping"):
        apply_diffs(ORIGINAL, [DIFF_B, DIFF_B_OVERLAP])
    with pytest.raises(PatchConflict, match="does not fit"):
        apply_diffs("a\nX\nc\n", [DIFF_B])


def test_no_newline_at_end_of_file() -> None:
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n"
    (hunk,) = parse_hunks(diff + "\\ No newline at end of file\n")
    assert hunk.old_lines == ("a\n", "b")
    assert hunk.new_lines == ("a\n", "c")
    assert apply_diffs("a\nb", [diff + "\\ No newline at end of file\n"]) == "a\nc"


VERIFIED = PRECISION_FIXES


def _rescan(file: Path) -> Report:
    return scan_file(str(file))


@pytest.mark.parametrize("path", VERIFIED, ids=lambda p: p.stem)
def test_every_precision_fix_is_verified_by_rescan(path: Path) -> None:
    report = verify_fixes(scan_file(str(path)), _rescan)
    fix = report.findings[0].fix
    assert fix is not None and fix.diff is not None
    assert fix.verified is True
    if path.stem == "fx_eps_underflow":  # the true gradient overflow of x / 1e-8 stays
        assert [r.split()[0] for r in fix.remaining] == ["NH401"]
    else:
        assert fix.remaining == ()


def test_half_mode_fix_is_verified_in_half_mode() -> None:
    settings = load_settings(overrides={"mode": "half"})
    path = FIXTURES / "fx_half_exp.py"
    report = verify_fixes(
        scan_file(str(path), settings), lambda file: scan_file(str(file), settings)
    )
    fix = report.findings[0].fix
    assert fix is not None and (fix.verified, fix.remaining) == (True, ())
    assert "torch.exp(logits.float())" in (fix.diff or "")


def test_a_fix_that_does_not_help_is_not_verified_and_not_applied(tmp_path: Path) -> None:
    path = tmp_path / "matrix_inverse.py"
    shutil.copy(EXAMPLES / "matrix_inverse.py", path)
    report = scan_file(str(path))
    unchanged = verify_fixes(report, lambda _copy: report)  # a re-scan that still has it
    fix = unchanged.findings[0].fix
    assert fix is not None and fix.verified is False
    assert fix.remaining[0].startswith("NH101 torch.matmul at line")
    (applied,) = apply_fixes(unchanged)
    assert applied.fixed == ()
    assert "did not remove the finding" in applied.skipped[0][1]
    assert path.read_text() == (EXAMPLES / "matrix_inverse.py").read_text()


runner = CliRunner()


def _copy(tmp_path: Path, source: Path) -> Path:
    target = tmp_path / source.name
    shutil.copy(source, target)
    return target


def test_plain_scan_writes_nothing(tmp_path: Path) -> None:
    path = _copy(tmp_path, EXAMPLES / "matrix_inverse.py")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = runner.invoke(app, ["scan", str(path)])
    assert result.exit_code == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert "[safe, verified by re-scan]" in result.stdout


def test_fix_writes_the_file_keeps_a_backup_and_rescans_clean(tmp_path: Path) -> None:
    path = _copy(tmp_path, EXAMPLES / "matrix_inverse.py")
    original = path.read_text()
    result = runner.invoke(app, ["scan", str(path), "--fix"])
    assert result.exit_code == 0, result.stdout
    assert "fixed NH101" in result.stderr
    assert (tmp_path / "matrix_inverse.py.orig").read_text() == original
    assert 'with torch.autocast(device_type="cuda", enabled=False):' in path.read_text()
    assert scan_file(str(path)).errors == 0
    assert not list(tmp_path.glob(".matrix_inverse.py.*.tmp"))


def test_fix_without_backup(tmp_path: Path) -> None:
    path = _copy(tmp_path, EXAMPLES / "attention_unscaled.py")
    result = runner.invoke(app, ["scan", str(path), "--fix", "--no-backup"])
    assert result.exit_code == 0
    assert not (tmp_path / "attention_unscaled.py.orig").exists()


def test_diff_prints_the_patch_and_changes_nothing(tmp_path: Path) -> None:
    path = _copy(tmp_path, EXAMPLES / "matrix_inverse.py")
    original = path.read_text()
    result = runner.invoke(app, ["scan", str(path), "--diff"])
    assert result.exit_code == 1
    assert result.stdout.startswith("--- a/matrix_inverse.py\n+++ b/matrix_inverse.py\n")
    assert path.read_text() == original


def test_fix_all_reports_rounds_and_ends_clean(tmp_path: Path) -> None:
    path = _copy(tmp_path, FIXTURES / "fx_cast_overflow.py")
    result = runner.invoke(app, ["scan", str(path), "--fix-all", "--no-backup"])
    assert result.exit_code == 0, result.stdout
    assert "round 1: fixed NH101" in result.stderr
    assert result.stdout.rstrip().splitlines()[-1].startswith("clean:")


def test_real_bug_is_never_patched(tmp_path: Path) -> None:
    path = _copy(tmp_path, FIXTURES / "fx_real_nan.py")
    original = path.read_text()
    result = runner.invoke(app, ["scan", str(path), "--fix-all"])
    assert result.exit_code == 1
    assert "not fixed: NH301 (no automatic fix)" in result.stderr
    assert path.read_text() == original


def test_report_fields_for_verification() -> None:
    report = verify_fixes(scan_file(str(EXAMPLES / "matrix_inverse.py")), _rescan)
    fix = report_dict(report)["findings"][0]["fix"]
    assert (fix["applicability"], fix["verified"], fix["remaining"]) == ("safe", True, [])
    unverified = report_dict(scan_file(str(EXAMPLES / "matrix_inverse.py")))
    assert unverified["findings"][0]["fix"]["verified"] is None


@pytest.mark.parametrize(
    "example", [EXAMPLES / "matrix_inverse.py", EXAMPLES / "attention_unscaled.py"],
    ids=lambda p: p.stem,
)
def test_fix_all_makes_every_bundled_example_with_findings_clean(
    tmp_path: Path, example: Path
) -> None:
    path = _copy(tmp_path, example)
    result = runner.invoke(app, ["scan", str(path), "--fix-all"])
    assert result.exit_code == 0, result.stdout
    assert "round 1: fixed" in result.stderr
    assert scan_file(str(path)).errors == 0
