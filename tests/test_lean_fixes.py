"""The change the cause calls for, at the least FP32 (issue 36, what was left): an eps FP16
flushes leads NH202's fix too, a half-mode value beyond FP16 is clamped at its producer, a mask
constant stays finite after the ops that follow it, and the culprit op alone in FP32 under
``model.half()``. Each: the fix chosen, its cost, and ``--fix-all`` clean with it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.config import load_settings
from nan_hunter.findings import Applicability, Finding, Report
from tests.conftest import FIXTURES

runner = CliRunner()


def _scan(path: Path, mode: str) -> Report:
    return scan_file(str(path), load_settings(overrides={"mode": mode}))


def _error(report: Report) -> Finding:
    (finding,) = [f for f in report.findings if f.is_error]
    return finding


def _fix_all(path: Path, mode: str, tmp_path: Path) -> str:
    """``--fix-all`` on a copy: it ends clean; the copy's text after it."""
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    result = runner.invoke(app, ["scan", str(copy), "--fix-all", "--no-backup", "--mode", mode])
    assert result.exit_code == 0, (result.stderr, result.stdout)
    assert "round 1: fixed" in result.stderr and "round 2: fixed" not in result.stderr
    return copy.read_text()


# --- NH202: the eps the flushed values lost --------------------------------------------------

EPS_FLUSHED = FIXTURES / "fx_eps_flushed.py"


@pytest.mark.parametrize("mode", ["autocast", "half"])
def test_nh202_leads_with_the_eps_its_flush_lost(mode: str) -> None:
    """The flush is blamed on ``torch.sqrt``; the add before it has an eps buffer of 1e-9 (0 in
    FP16; under ``.half()`` the buffer is 0 itself, its FP32 value read from the reference
    run): the fix is that eps written as 1e-4, measured harmless, moving nothing to FP32."""
    finding = _error(_scan(EPS_FLUSHED, mode))
    assert finding.code == "NH202"
    fix = finding.fix
    assert fix is not None
    assert fix.title == (
        "Use an eps float16 can hold: 1e-4 instead of 1.00e-09 (changes the numerics)"
    )
    assert fix.applicability is Applicability.UNSAFE
    assert fix.verified is True and fix.measured_harmless
    assert fix.cost is not None
    assert fix.cost.added_matmul_share == 0.0 and fix.cost.added_elementwise_share == 0.0
    assert [e.replacement for e in fix.edits] == [
        '        self.register_buffer("eps", torch.tensor(1e-4))\n'
    ]


@pytest.mark.parametrize("mode", ["autocast", "half"])
def test_nh202_fix_all_changes_the_eps_only(mode: str, tmp_path: Path) -> None:
    after = _fix_all(EPS_FLUSHED, mode, tmp_path)
    assert after == EPS_FLUSHED.read_text().replace("torch.tensor(1e-9)", "torch.tensor(1e-4)")


# --- half mode: the culprit op alone ---------------------------------------------------------

EINSUM = FIXTURES / "fx_einsum_beside_linear.py"
# batch 4 x 64 tokens; the einsum 32 -> 32, block.big 256 -> 32, the head 32 -> 8
EINSUM_FLOPS = 2 * 4 * 64 * 32 * 32
ALL_FLOPS = EINSUM_FLOPS + 2 * 4 * 64 * 256 * 32 + 2 * 4 * 64 * 32 * 8
EINSUM_ALONE = (
    '        einsum_fp32 = (torch.einsum("btd,de->bte", u.float(), self.w.float()) * 1e-3)'
    ".to(u.dtype)\n"
    "        y = self.big(x) + einsum_fp32  # <- culprit\n"
)


def test_half_mode_takes_the_einsum_alone_not_the_kept_module() -> None:
    """Under ``model.half()`` the einsum (1.4e6, beyond FP16) is computed alone from upcast
    operands, with the ``* 1e-3`` that brings it back into range, and cast back to ``u``'s
    dtype: 10.8% of the FLOPs in FP32, where the kept module moved 97.3%."""
    finding = _error(_scan(EINSUM, "half"))
    fix = finding.fix
    assert fix is not None and fix.verified is True
    assert fix.title == (
        "Compute torch.einsum alone in FP32, with the Tensor.__mul__ that brings it back into "
        "float16's range (its float16 operands upcast, the result cast back; the rest of its "
        "statement stays in float16)"
    )
    assert fix.applicability is Applicability.SAFE
    assert "".join(e.replacement for e in fix.edits) == EINSUM_ALONE
    assert fix.cost is not None
    assert fix.cost.added_matmul_share == pytest.approx(EINSUM_FLOPS / ALL_FLOPS)  # 0.108
    assert not fix.cost.most_of_the_model


def test_half_mode_fix_all_ends_clean_with_the_einsum_alone(tmp_path: Path) -> None:
    after = _fix_all(EINSUM, "half", tmp_path)
    assert EINSUM_ALONE in after and "_apply" not in after
