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
from nan_hunter.findings import Applicability, Finding, Report
from nan_hunter.fixes.rewrites import scalar_literal
from nan_hunter.fixes.verify import verify_fix
from nan_hunter.project.config import load_settings
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


# --- NH104: a mask constant that stays finite after what follows -----------------------------

MASK_THEN_OFFSET = FIXTURES / "fx_mask_then_bias.py"
MASK_EDIT = "        scores = scores + (1.0 - m)[:, None, :] * -1e4  # <- culprit\n"


@pytest.mark.parametrize("mode", ["autocast", "half"])
def test_a_mask_added_to_gets_a_constant_fp16_keeps_finite(mode: str) -> None:
    """An add takes the masked value (and an offset is subtracted after it): -65504 would be
    -inf there, so the constant becomes -1e4, unsafe and measured harmless (0.43%)."""
    finding = _error(_scan(MASK_THEN_OFFSET, mode))
    assert finding.code == "NH104"
    fix = finding.fix
    assert fix is not None
    assert fix.title == (
        "Use -1e4 instead of -1.00e+09: finite in float16 after the add that follows "
        "(changes the numerics)"
    )
    assert fix.applicability is Applicability.UNSAFE
    assert fix.verified is True and fix.measured_harmless
    assert fix.fp32_loss_change == pytest.approx(0.0043, abs=5e-4)
    assert fix.cost is not None and fix.cost.added_matmul_share == 0.0
    assert [e.replacement for e in fix.edits] == [MASK_EDIT]


def test_the_dtype_limit_is_no_fix_when_an_add_follows() -> None:
    """Why: with ``torch.finfo(dtype).min`` the padded sample's rows are -inf after the offset
    is subtracted, and NaN after the softmax: not verified."""
    report = scan_file(str(MASK_THEN_OFFSET), load_settings(overrides={"mode": "half"}),
                       verify=False)
    finding = _error(report)
    assert finding.fix is not None
    (limit,) = finding.fix.alternatives
    assert limit.title == "Use torch.finfo(tensor.dtype).min instead of -1.00e+09"
    verdict = verify_fix(limit, finding, report, _rescan_half, MASK_THEN_OFFSET)
    assert verdict.verified is False


def _rescan_half(entry: Path) -> Report:
    return scan_file(str(entry), load_settings(overrides={"mode": "half"}), verify=False)


def test_a_masked_fill_followed_by_softmax_keeps_the_dtype_limit() -> None:
    """Only the softmax takes the filled scores (its own max-subtraction is inside it): the
    dtype's limit stays the fix, safe."""
    fix = _error(_scan(FIXTURES / "fx_mask_constant.py", "half")).fix
    assert fix is not None and fix.alternatives == ()
    assert fix.title == "Use torch.finfo(tensor.dtype).min instead of -1.00e+09"


@pytest.mark.parametrize("mode", ["autocast", "half"])
def test_mask_fix_all_ends_clean_with_the_finite_constant(mode: str, tmp_path: Path) -> None:
    after = _fix_all(MASK_THEN_OFFSET, mode, tmp_path)
    assert after == MASK_THEN_OFFSET.read_text().replace(
        "(1.0 - m)[:, None, :] * -1e9", "(1.0 - m)[:, None, :] * -1e4"
    )


def test_a_negative_constant_is_rewritten_where_the_file_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("class A:\n    neg = -1e9\n\n    def f(self, s, m):\n"
                    "        return s + m * self.neg\n")
    assert scalar_literal(path, 5, -1e9, "-1e4") == (
        "class A:\n    neg = -1e4\n\n    def f(self, s, m):\n        return s + m * self.neg\n"
    )
    assert scalar_literal(path, 5, 1e9, "1e4") is None  # the 1e9 of -1e9 is not a 1e9


# --- half mode: a residual sum FP16 cannot hold, clamped at its producer ---------------------

RESIDUAL = FIXTURES / "fx_residual_overflow.py"
CLAMPED = (
    "        h_in_dtype = h.dtype\n"
    "        h = h.float() + self.ff(h).float()  # <- culprit\n"
    "        if h_in_dtype == torch.float16:\n"
    "            clamp_value = torch.finfo(h_in_dtype).max - 1000\n"
    "            h = torch.clamp(h, min=-clamp_value, max=clamp_value)\n"
    "        h = h.to(h_in_dtype)\n"
)


def test_a_residual_sum_beyond_fp16_is_clamped_not_kept_in_fp32() -> None:
    """The sum (8e4) computed in FP32 and cast back is inf again before the FP16 LayerNorm;
    transformers' T5 clamp at the producer verifies, changes nothing in FP32 (0%), and moves
    no matmul FLOPs, where the kept module moved 88.9%."""
    finding = _error(_scan(RESIDUAL, "half"))
    assert (finding.code, finding.op) == ("NH109", "Tensor.__add__")
    fix = finding.fix
    assert fix is not None
    assert fix.title == (
        "Clamp the sum to float16's finite range: computed in FP32, clamped to "
        "±(finfo.max - 1000) when it came in as float16, cast back (changes only values the "
        "format cannot hold)"
    )
    assert fix.applicability is Applicability.UNSAFE
    assert fix.verified is True and fix.measured_harmless and fix.fp32_loss_change == 0.0
    assert fix.cost is not None and fix.cost.added_matmul_share == 0.0
    assert "".join(e.replacement for e in fix.edits) == CLAMPED


def test_the_sum_cast_back_alone_is_inf_again() -> None:
    """Why the clamp: the statement's FP32 region, cast back, is not verified."""
    report = scan_file(str(RESIDUAL), load_settings(overrides={"mode": "half"}), verify=False)
    finding = _error(report)
    assert finding.fix is not None
    region = finding.fix
    assert region.title == (
        "Compute Tensor.__add__ in FP32 (FP32 inputs, results cast back to float16)"
    )
    assert verify_fix(region, finding, report, _rescan_half, RESIDUAL).verified is False
    assert finding.fix.alternatives[0].title.startswith("Clamp the sum")


def test_residual_fix_all_ends_clean_with_the_clamp(tmp_path: Path) -> None:
    after = _fix_all(RESIDUAL, "half", tmp_path)
    assert CLAMPED in after and "_apply" not in after


# --- no region: the elementwise ops in FP32, the matmuls around them in FP16 ------------------

LOG1P_CLAMP = FIXTURES / "fx_log1p_clamp.py"
LOG1P_TAIL = "        p = torch.sigmoid(self.fc(x).float())\n"


def test_the_ops_that_rounded_are_upcast_after_the_linear_not_before_it() -> None:
    """``sigmoid(12)`` rounds to 1.0 in FP16 and ``log1p(-1)`` is -inf: the statement region
    upcast ``x`` and ran the Linear in FP32 (all of the model's matmul FLOPs); the value is
    now upcast where it leaves the Linear, and the sigmoid, clamp and log1p after it run in
    FP32 under autocast with no region."""
    finding = _error(_scan(LOG1P_CLAMP, "autocast"))
    fix = finding.fix
    assert fix is not None and fix.verified is True
    assert fix.title == (
        "Compute torch.sigmoid, Tensor.clamp, Tensor.__neg__ up to torch.log1p in FP32: their "
        "float16 inputs upcast where they leave the last matmul/conv or module (no region; the "
        "matmuls around stay in float16)"
    )
    assert fix.applicability is Applicability.SAFE
    assert [e.replacement for e in fix.edits] == [LOG1P_TAIL]
    assert fix.cost is not None and fix.cost.added_matmul_share == 0.0
    # the statement region, which runs the Linear in FP32 too, is not tried once this verified
    assert all("autocast" not in e.replacement for alt in fix.alternatives for e in alt.edits
               if alt.verified)


def test_fix_all_upcasts_after_the_linear(tmp_path: Path) -> None:
    after = _fix_all(LOG1P_CLAMP, "autocast", tmp_path)
    assert after == LOG1P_CLAMP.read_text().replace(
        "        p = torch.sigmoid(self.fc(x))\n", LOG1P_TAIL
    )


SCORES_THEN_V = '''
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        nn.init.normal_(self.q.weight)
        nn.init.normal_(self.k.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-2, -1)
        return scores.softmax(-1) @ v


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attn(32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Model()


def sample_batch() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(2, 8, 32) * 30.0
'''


def test_half_mode_scores_go_back_to_fp16_at_the_softmax(tmp_path: Path) -> None:
    """Under ``.half()`` the unscaled scores (beyond 65504) are computed from upcast ``q`` and
    ``k``; the softmax brings them back into range and is cast back there, so ``@ v`` stays in
    FP16: the FP32 share is the scores matmul alone (the region down to the statement with the
    softmax moved ``@ v`` too)."""
    path = tmp_path / "attn_then_v.py"
    path.write_text(SCORES_THEN_V)
    finding = _error(_scan(path, "half"))
    fix = finding.fix
    assert fix is not None and fix.verified is True
    assert "the result cast back at Tensor.softmax" in fix.title
    assert "".join(e.replacement for e in fix.edits) == (
        "        scores = q.float() @ k.transpose(-2, -1).float()\n"
        "        return scores.softmax(-1).to(q.dtype) @ v\n"
    )
    # batch 2 x 8 tokens, d = 32: q, k, v and the head are Linears; scores and @ v matmuls
    linears = 3 * 2 * 2 * 8 * 32 * 32 + 2 * 2 * 8 * 32 * 4
    attention = 2 * (2 * 2 * 8 * 8 * 32)
    assert fix.cost is not None
    assert fix.cost.added_matmul_share == pytest.approx((attention / 2) / (linears + attention))


# --- a fix that moves most of the model ranks after a cheaper one, an unsafe one included ------


def _mask_buffer_model(tmp_path: Path) -> Path:
    """Half mode, ``scores + (1 - m) * self.neg`` with a -1e9 buffer (-inf after ``.half()``):
    -1e4 verifies but moves the FP32 loss by 9.1% (beyond the 5% tolerance); the kept module
    verifies and moves 91.7% of the matmul FLOPs to FP32."""
    from tests.fix_shapes.generator import build

    model = build("mask", "additive", "tensor_attr", "half", 1)
    return model.write(tmp_path)


def test_the_kept_module_that_moves_most_of_the_model_ranks_after_the_unsafe_constant(
    tmp_path: Path,
) -> None:
    finding = next(f for f in _scan(_mask_buffer_model(tmp_path), "half").findings
                   if f.code == "NH005")
    assert finding.fix is not None and not finding.fix.edits  # the rule's advice
    constant, kept = finding.fix.alternatives[:2]
    assert constant.title.startswith("Use -1e4 instead of -1.00e+09")
    assert constant.applicability is Applicability.UNSAFE and constant.verified is True
    assert not constant.measured_harmless
    assert constant.fp32_loss_change == pytest.approx(0.091, abs=0.005)
    assert kept.title.startswith("Keep ") and kept.verified is True
    assert kept.cost is not None and kept.cost.most_of_the_model


def test_fix_takes_the_safe_one_and_names_the_cheaper_unsafe_one(tmp_path: Path) -> None:
    path = _mask_buffer_model(tmp_path)
    result = runner.invoke(app, ["scan", str(path), "--fix", "--no-backup", "--mode", "half"])
    assert result.exit_code == 0, result.stderr
    assert "NH005: a cheaper, unsafe fix was not taken (Use -1e4 instead of -1.00e+09" in (
        result.stderr
    )
    assert "--unsafe-fixes takes it" in result.stderr
    assert "def _apply(" in path.read_text() and "torch.tensor(-1e9)" in path.read_text()


def test_unsafe_fixes_takes_the_cheaper_constant(tmp_path: Path) -> None:
    path = _mask_buffer_model(tmp_path)
    result = runner.invoke(
        app, ["scan", str(path), "--fix", "--unsafe-fixes", "--no-backup", "--mode", "half"]
    )
    assert result.exit_code == 0, result.stderr
    text = path.read_text()
    assert "torch.tensor(-1e4)" in text and "_apply" not in text


def test_the_cast_back_encloses_the_upcast_operands_at_the_same_offsets(tmp_path: Path) -> None:
    """``a * b`` upcast and cast back: the opening parenthesis goes before ``a``'s cast, the
    closing ``).to(...)`` after ``b``'s (the same offsets as the operands' own edits)."""
    from nan_hunter.fixes.tail_upcast import build_tail_upcast_patch

    path = tmp_path / "m.py"
    path.write_text("def f(a, b):\n    h = a * b\n    return h\n")
    patch = build_tail_upcast_patch(
        path, [(2, "Tensor.__mul__", 2, frozenset())], relative_to=tmp_path,
        cast_back=(2, "Tensor.__mul__"),
    )
    assert patch is not None
    assert patch.new_source == (
        "def f(a, b):\n    h = (a.float() * b.float()).to(a.dtype)\n    return h\n"
    )
