"""Fixes that are proven: hunk application, verification by re-scan, --fix, --diff, --fix-all."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.findings import Edit, Report
from nan_hunter.fixes.edits import EditConflict, LineMap, apply_edits, edits_between
from nan_hunter.fixes.verify import verify_fixes
from nan_hunter.fixes.workflow import apply_fixes
from nan_hunter.project.config import load_settings
from nan_hunter.report.json_report import report_dict
from tests.conftest import EXAMPLES, FIXTURES, PRECISION_FIXES

ORIGINAL = "a\nb\nc\nd\ne\nf\ng\nh\n"


def _edit(start_line: int, end_line: int, new: str, text: str = ORIGINAL) -> Edit:
    """Replace 1-based lines ``[start_line, end_line)`` of ``text`` with ``new``."""
    lines = text.splitlines(keepends=True)
    start = sum(len(x) for x in lines[: start_line - 1])
    end = sum(len(x) for x in lines[: end_line - 1])
    return Edit("x.py", start, end, new)


def test_edits_of_several_fixes_apply_together() -> None:
    b_edit, g_edit = _edit(2, 3, "B\n"), _edit(7, 8, "G\nG2\n")
    assert apply_edits(ORIGINAL, [b_edit, g_edit]) == "a\nB\nc\nd\ne\nf\nG\nG2\nh\n"
    top = _edit(1, 1, "import torch\n")
    # the same insertion from two fixes is applied once
    assert apply_edits(ORIGINAL, [top, top, b_edit]).startswith("import torch\na\nB\n")


def test_overlapping_or_stale_edits_are_refused() -> None:
    with pytest.raises(EditConflict, match="same text"):
        apply_edits(ORIGINAL, [_edit(2, 3, "B\n"), _edit(1, 3, "a\nbeta\n")])
    with pytest.raises(EditConflict, match="same text"):
        apply_edits(ORIGINAL, [_edit(2, 2, "x\n"), _edit(2, 2, "y\n")])
    with pytest.raises(EditConflict, match="does not fit"):
        apply_edits("a\n", [_edit(2, 3, "B\n")])


def test_edits_between_and_line_map() -> None:
    new = "a\nb\nwith x:\n    c\n    d\ne\nf\ng\nh"
    edits = edits_between(Path("x.py"), ORIGINAL, new)
    assert apply_edits(ORIGINAL, edits) == new
    line_map = LineMap.of(ORIGINAL, edits)
    assert line_map.origin(2) == (2, 2, False)
    assert line_map.origin(4) == (3, 4, True)  # "    c" came from the edited lines 3-4
    assert line_map.origin(6) == (5, 5, False)
    assert line_map.origin(9) == (8, 8, True)  # the last line lost its newline


VERIFIED = PRECISION_FIXES


def _rescan(file: Path) -> Report:
    return scan_file(str(file))


@pytest.mark.parametrize("path", VERIFIED, ids=lambda p: p.stem)
def test_every_precision_fix_is_verified_by_rescan(path: Path) -> None:
    report = scan_file(str(path))
    fix = report.findings[0].fix
    assert fix is not None and fix.diff is not None
    if path.stem == "fx_eps_large_change":
        # The eps FP16 holds comes first and changes the loss by 26%; the upcast with no
        # region and the FP32 region (its next alternatives) remove the NaN, but the true
        # gradient of x / 1e-8 then overflows where it enters the FP16 Linear output (at the
        # cast each adds): an error the original scan did not have, so none is verified.
        assert fix.verified is False
        assert fix.applicability.value == "unsafe"
        assert fix.fp32_loss_change == pytest.approx(0.2591, abs=1e-4)
        upcast, region = fix.alternatives[:2]
        assert (upcast.verified, region.verified) == (False, False)
        assert upcast.remaining == (
            "NH401 Tensor.float at fx_eps_large_change.py:27 (new: the original scan did not "
            "have it)",
        )
        assert region.remaining == (
            "NH401 Tensor.float at fx_eps_large_change.py:28 (new: the original scan did not "
            "have it)",
        )
    else:
        assert (fix.verified, fix.remaining) == (True, ())


def test_half_mode_fix_is_verified_in_half_mode() -> None:
    settings = load_settings(overrides={"mode": "half"})
    path = FIXTURES / "fx_half_exp.py"
    report = scan_file(str(path), settings)
    fix = report.findings[0].fix
    assert fix is not None and (fix.verified, fix.remaining) == (True, ())
    assert "torch.exp(logits.float())" in (fix.diff or "")


def test_a_fix_that_does_not_help_is_not_verified_and_not_applied(tmp_path: Path) -> None:
    path = tmp_path / "matrix_inverse.py"
    shutil.copy(EXAMPLES / "matrix_inverse.py", path)
    report = scan_file(str(path), verify=False)
    unchanged = verify_fixes(report, lambda _copy: report, path)  # a re-scan that still has it
    fix = unchanged.findings[0].fix
    assert fix is not None and fix.verified is False
    assert fix.remaining[0] == (
        "NH101 torch.matmul at matrix_inverse.py:46 (the fixed op still fails)"
    )
    (applied,) = apply_fixes(unchanged)
    assert applied.fixed == ()
    reason = applied.skipped[0][1]
    assert reason.startswith("not verified: NH101 torch.matmul at matrix_inverse.py:46")
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
    assert "[safe, verified by re-scan; keeps" in result.stdout


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
    report = scan_file(str(EXAMPLES / "matrix_inverse.py"))
    fix = report_dict(report)["findings"][0]["fix"]
    assert (fix["applicability"], fix["verified"], fix["remaining"]) == ("safe", True, [])
    unverified = report_dict(scan_file(str(EXAMPLES / "matrix_inverse.py"), verify=False))
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


def test_a_skipped_fix_says_what_failed_its_proof() -> None:
    """Errors the original scan had too, and the note on a group re-scan, are listed in
    ``remaining`` but are not why the fix was not verified: the reason is the first that is."""
    from nan_hunter.findings import Applicability, Fix
    from nan_hunter.fixes.select import why_not

    edit = Edit("model.py", 3, 3, "    y = x.float() * w\n")
    fix = Fix(
        "keep it in FP32", Applicability.SAFE, (edit,), verified=False,
        remaining=(
            "NH102 torch.matmul at model.py:9 (was there before)",
            "the loss is not finite after the fix",
            "re-scanned together with the independent fixes for heads.1",
        ),
    )  # fmt: skip
    assert why_not(fix, unsafe=False) == "not verified: the loss is not finite after the fix"
    only_old = Fix(
        "keep it in FP32", Applicability.SAFE, (edit,), verified=False,
        remaining=("NH102 torch.matmul at model.py:9 (was there before)",),
    )  # fmt: skip
    assert why_not(only_old, unsafe=False) == "not verified: the finding remained"
