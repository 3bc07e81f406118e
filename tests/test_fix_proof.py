"""Verification that can't be fooled: patches that must fail the proof, and never be written."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.findings import Applicability, Finding, Report
from nan_hunter.fixes.autocast_region import build_autocast_region_patch
from nan_hunter.fixes.build import make_fix
from nan_hunter.fixes.edits import edits_between
from nan_hunter.fixes.source_file import read_source
from nan_hunter.fixes.verify import verify_fixes
from nan_hunter.fixes.workflow import apply_fixes
from tests.conftest import EXAMPLES, FIXTURES, marker_line

runner = CliRunner()


def _with_fix(report: Report, new_text: str, path: Path) -> tuple[Report, Finding]:
    """``report`` whose first finding carries the hand-made patch ``new_text`` of ``path``."""
    edits = edits_between(path, read_source(path).text, new_text)
    fix = make_fix("hostile patch", Applicability.SAFE, edits, path.parent)
    first = replace(report.findings[0], fix=fix)
    return replace(report, findings=(first, *report.findings[1:])), first


def _rescan(file: Path) -> Report:
    return scan_file(str(file), verify=False)


def _copy(tmp_path: Path, source: Path) -> Path:
    target = tmp_path / source.name
    shutil.copy(source, target)
    return target


def test_no_op_region_after_an_fp16_clamp_is_not_verified_and_never_written(
    tmp_path: Path,
) -> None:
    # The GLiNER case: the FP32 region around log1p alone, on a value the FP16 clamp already
    # rounded to 1.0: the op still fails (as NH900, one line lower), so not verified.
    path = _copy(tmp_path, FIXTURES / "fx_log1p_clamp.py")
    report = scan_file(str(path), verify=False)
    culprit = marker_line(path, "# <- culprit")
    patch = build_autocast_region_patch(path, culprit, "torch.log1p", 1)
    assert patch is not None and "torch.log1p(-s.float())" in patch.new_source
    hostile, _ = _with_fix(report, patch.new_source, path)
    verified = verify_fixes(hostile, _rescan, path).findings[0].fix
    assert verified is not None and verified.verified is False
    assert verified.remaining[0] == (
        f"NH900 torch.log1p at fx_log1p_clamp.py:{culprit + 1} (the fixed op still fails)"
    )
    before = path.read_bytes()
    (applied,) = apply_fixes(verify_fixes(hostile, _rescan, path))
    assert applied.fixed == () and applied.backup is None
    assert applied.skipped[0][1].startswith("not verified: NH900 torch.log1p")
    assert path.read_bytes() == before


def test_a_patch_that_moves_the_failure_one_line_down_is_not_verified(tmp_path: Path) -> None:
    path = _copy(tmp_path, EXAMPLES / "matrix_inverse.py")
    report = scan_file(str(path), verify=False)
    text = read_source(path).text
    moved = text.replace(
        "        codes = torch.matmul(dtd_inv, z)\n",
        "        with torch.autocast(device_type=\"cuda\", enabled=False):\n"
        "            codes = torch.matmul(dtd_inv.float(), z.float())\n"
        "        codes = torch.matmul(codes * 1e3, torch.eye(codes.shape[1])) / 1e3\n",
    )
    hostile, _ = _with_fix(report, moved, path)
    fix = verify_fixes(hostile, _rescan, path).findings[0].fix
    assert fix is not None and fix.verified is False
    # the same op (torch.matmul in the root module) fails again at a line the patch wrote
    assert fix.remaining[0] == (
        "NH101 torch.matmul at matrix_inverse.py:48 (the fixed op still fails)"
    )


def test_a_patch_that_changes_what_the_model_computes_is_not_verified(tmp_path: Path) -> None:
    # No error is left, but the model now computes zeros: the loss is not the FP32 loss.
    path = _copy(tmp_path, EXAMPLES / "matrix_inverse.py")
    report = scan_file(str(path), verify=False)
    text = read_source(path).text
    changed = text.replace(
        "        codes = torch.matmul(dtd_inv, z)\n",
        "        codes = torch.zeros_like(z)\n",
    )
    hostile, _ = _with_fix(report, changed, path)
    fix = verify_fixes(hostile, _rescan, path).findings[0].fix
    assert fix is not None and fix.verified is False
    assert fix.remaining[-1].startswith("the loss changed:")
    result = runner.invoke(app, ["scan", str(path), "--fix-all"])
    assert "zeros_like" not in path.read_text()
    assert result.exit_code == 0  # the tool's own, honest fix was written instead


def test_a_failing_rescan_is_reported_as_such(tmp_path: Path) -> None:
    path = _copy(tmp_path, EXAMPLES / "matrix_inverse.py")
    report = scan_file(str(path), verify=False)
    broken = read_source(path).text.replace(
        "        codes = torch.matmul(dtd_inv, z)\n", "        codes = undefined_name\n"
    )
    hostile, _ = _with_fix(report, broken, path)
    fix = verify_fixes(hostile, _rescan, path).findings[0].fix
    assert fix is not None and fix.verified is False
    assert fix.remaining[0].startswith("the re-scan failed: the model raised NameError")
