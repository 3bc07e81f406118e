"""--fix-all on every fixture and example with a precision culprit, in autocast and half mode:
it ends clean, and the whole change it made is a golden diff per template. It converges or
says why, and identical fixes are applied once."""

from __future__ import annotations

import difflib
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.fixes.select import select_fixes
from nan_hunter.project.config import load_settings
from tests.conftest import EXAMPLES, FIXTURES, GOLDEN

runner = CliRunner()

CASES = [
    # (model, mode, extra options, template)
    (EXAMPLES / "matrix_inverse.py", "autocast", (), "region with the producer"),
    (EXAMPLES / "attention_unscaled.py", "autocast", (), "region"),
    (FIXTURES / "fx_inverse_boundary.py", "autocast", (), "region grown to the FP16 producer"),
    (FIXTURES / "fx_log1p_clamp.py", "autocast", (), "region from the rounded values"),
    (FIXTURES / "fx_flush_log.py", "autocast", (), "region from the flushed values"),
    (FIXTURES / "fx_eps_underflow.py", "autocast", (), "eps FP16 can hold, measured harmless"),
    (FIXTURES / "fx_eps_attribute.py", "autocast", (), "eps where the file writes it"),
    (FIXTURES / "fx_eps_flushed.py", "autocast", (), "NH202: the eps its flush lost"),
    (FIXTURES / "fx_mask_constant.py", "autocast", (), "finfo limit"),
    (FIXTURES / "fx_mask_then_bias.py", "autocast", (), "-1e4: an add follows the mask"),
    (FIXTURES / "fx_bce_logits.py", "autocast", (), "with-logits"),
    (FIXTURES / "fx_scale_attribute.py", "autocast", (), "in-place by a float, never cast"),
    (FIXTURES / "fx_bce_banned.py", "autocast", (), "BCE in an FP32 region"),
    (EXAMPLES / "attention_unscaled.py", "half", (), "half: upcast, cast back"),
    (FIXTURES / "fx_half_exp.py", "half", (), "half: upcast"),
    (FIXTURES / "fx_log1p_clamp.py", "half", (), "half: from the rounded values"),
    (FIXTURES / "fx_atanh_rounding.py", "half", (), "half: module result upcast"),
    (FIXTURES / "fx_eps_underflow.py", "half", (), "half: eps, measured harmless"),
    (FIXTURES / "fx_eps_attribute.py", "half", (), "half: eps where the file writes it"),
    (FIXTURES / "fx_eps_flushed.py", "half", (), "half: NH202, the eps buffer"),
    (FIXTURES / "fx_out_of_range_warning.py", "half", (), "half: cast back in the parent"),
    (FIXTURES / "fx_scale_attribute.py", "half", (), "half: in-place by a float, never cast"),
    (FIXTURES / "fx_einsum_beside_linear.py", "half", (), "half: the op alone, cast back"),
    (FIXTURES / "fx_mask_then_bias.py", "half", (), "half: -1e4, an add follows the mask"),
    (FIXTURES / "fx_residual_overflow.py", "half", (), "half: the sum clamped at its producer"),
]


def _diff(old: str, new: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}"
        )
    )


@pytest.mark.parametrize(
    ("model", "mode", "options", "template"), CASES,
    ids=[f"{m.stem}-{mode}" for m, mode, _, _ in CASES],
)
def test_fix_all_ends_clean_with_the_template(
    model: Path, mode: str, options: tuple[str, ...], template: str, tmp_path: Path,
    update_golden: bool,
) -> None:
    path = tmp_path / model.name
    shutil.copy(model, path)
    result = runner.invoke(
        app, ["scan", str(path), "--fix-all", "--no-backup", "--mode", mode, *options]
    )
    assert result.exit_code == 0, (template, result.stderr, result.stdout)
    assert "round 1: fixed" in result.stderr
    assert scan_file(str(path), load_settings(overrides={"mode": mode}), verify=False).errors == 0
    diff = _diff(model.read_text(), path.read_text(), model.name)
    golden = GOLDEN / "fix_all" / f"{model.stem}.{mode}.diff"
    if update_golden:
        golden.write_text(diff)
    assert diff == golden.read_text(), template


def test_fix_all_says_why_it_stops_and_writes_nothing_unverified(tmp_path: Path) -> None:
    """The eps FP16 holds changes this model's loss by 26%: not verified, and every FP32 region
    leaves an FP16 gradient overflow (NH401): nothing is written, and the reason is the first
    candidate's."""
    path = tmp_path / "fx_eps_large_change.py"
    shutil.copy(FIXTURES / "fx_eps_large_change.py", path)
    before = path.read_bytes()
    result = runner.invoke(app, ["scan", str(path), "--fix-all"])
    assert result.exit_code == 1
    assert (
        "--fix-all stopped: no fix left to apply (NH201: not verified: the loss changed: "
        "-0.62439 after the fix, -0.843358 in FP32 before it (the patch changes what the model "
        "computes))"
    ) in result.stderr
    assert path.read_bytes() == before
    assert not (tmp_path / "fx_eps_large_change.py.orig").exists()


def test_identical_fixes_are_selected_once() -> None:
    report = scan_file(str(EXAMPLES / "matrix_inverse.py"), verify=False)
    twice = replace(report, findings=(report.findings[0], report.findings[0]))
    selection = select_fixes(twice)
    assert len(selection.chosen) == 2
    assert selection.edits == report.findings[0].fix.edits  # type: ignore[union-attr]


def test_half_mode_advice_names_the_module_to_keep_in_fp32() -> None:
    """Under model.half() there is no autocast to disable: where no source edit can keep an FP16
    nn.Linear's output in range, the advice names that module and how to keep it in FP32."""
    settings = load_settings(None, {"mode": "half"})
    report = scan_file(str(FIXTURES / "fx_linear_overflow.py"), settings)
    (finding,) = [f for f in report.findings if f.code == "NH102"]
    assert finding.fix is not None and not finding.fix.edits
    assert finding.fix.applicability.value == "display-only"
    assert finding.fix.title == (
        "Compute torch.nn.functional.linear in FP32 (keep net.1 in FP32 after .half(): "
        "model.get_submodule('net.1').float(), and give it .float() inputs)"
    )
