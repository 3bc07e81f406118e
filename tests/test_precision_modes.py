"""Half mode (model.half()), BF16 scans, and the 'BF16 would avoid this' alternative."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from nan_hunter.api import scan
from nan_hunter.project.loader import load_target
from tests.conftest import EXAMPLES, FIXTURES, marker_line, scanned
from tests.test_model_state import _assert_same, _snapshot

ATTENTION = EXAMPLES / "attention_unscaled.py"


def test_half_mode_finds_the_unscaled_attention() -> None:
    report = scanned(ATTENTION, mode="half")
    assert report.target.mode == "half"
    first = report.findings[0]
    assert (first.code, first.op) == ("NH102", "Tensor.__matmul__")
    assert first.inputs[0].dtype == "float16"


def test_half_mode_restores_dtypes_and_values() -> None:
    target = load_target(str(FIXTURES / "fx_clean.py"))
    before = _snapshot(target.model)
    report = scan(target.model, target.batch.raw, mode="half")
    assert report.ops > 0
    assert all(p.dtype == torch.float32 for p in target.model.parameters())
    _assert_same(before, _snapshot(target.model))


def test_bfloat16_holds_what_float16_cannot() -> None:
    report = scanned(ATTENTION, dtype="bfloat16")
    assert report.target.dtype == "bfloat16"
    assert [f for f in report.findings if f.is_error] == []


def test_bf16_alternative_is_offered_for_range_problems_only() -> None:
    overflow = scanned(ATTENTION).findings[0]
    assert any(note.startswith("BF16 would avoid this") for note in overflow.notes)
    eps = scanned(FIXTURES / "fx_eps_underflow.py").findings[0]
    assert any("smallest normal" in note for note in eps.notes)
    real_bug = scanned(FIXTURES / "fx_real_nan.py").findings[0]
    assert real_bug.notes == ()


def test_real_fp16_kernels_give_the_same_culprit() -> None:
    emulated = scanned(ATTENTION).findings[0]
    real = scanned(ATTENTION, numerics="real").findings[0]
    assert (real.code, real.op, real.location) == (emulated.code, emulated.op, emulated.location)
    assert real.location is not None
    assert real.location.line == marker_line(ATTENTION, "# missing: / math.sqrt(d_model)")


# --- parameters and buffers that FP16 cannot hold (NH005) --------------------------------------

MASK_BUFFER = FIXTURES / "half_mask_buffer.py"


def _buffer_model(folder: Path, neg: str, use: str, name: str = "buffer_model.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(f"""\
        import torch
        from torch import nn


        class Attn(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.qk = nn.Linear(8, 16)
                self.register_buffer("neg", torch.tensor({neg}))

            def forward(self, x, mask):
                q, k = self.qk(x).chunk(2, dim=-1)
                att = q @ k.transpose(-2, -1)
                att = {use}
                return att.softmax(-1) @ x


        def build_model():
            torch.manual_seed(0)
            return Attn()


        def sample_batch():
            torch.manual_seed(0)
            return torch.randn(2, 6, 8), torch.tril(torch.ones(6, 6))
        """))
    return path


def test_a_buffer_beyond_fp16_is_the_origin_of_a_nan_loss_in_half_mode() -> None:
    """The NaN has no op to blame (its inputs were already -inf): the buffer is, at the line
    that registers it; the buffer that fits (-1e3) is not reported."""
    report = scanned(MASK_BUFFER, mode="half")
    errors = [f for f in report.findings if f.is_error]
    assert [(f.code, f.module, f.origin) for f in errors] == [("NH005", "block", True)]
    (finding,) = errors
    assert finding.location is not None
    assert finding.location.line == marker_line(MASK_BUFFER, "buffer")
    assert finding.message.startswith("block.neg (CausalAttn) holds 1 value(s) up to |x| = "
                                      "1.00e+10 that float16 cannot hold")
    assert finding.message.endswith("and the loss is not finite")
    assert finding.fix is not None and not finding.fix.edits


def test_a_buffer_beyond_fp16_that_every_op_survives_is_a_warning(tmp_path: Path) -> None:
    """``masked_fill(mask == 0, -inf)`` and a softmax over rows that are never fully masked
    stay finite: the meaning changed, the loss did not (yet)."""
    path = _buffer_model(tmp_path, "-1e10", "att.masked_fill(mask == 0, self.neg)")
    report = scanned(path, mode="half")
    assert [(f.code, f.severity.value, f.origin) for f in report.findings] == [
        ("NH005", "warning", False)
    ]


def test_buffers_are_not_reported_where_fp32_already_holds_inf_or_autocast_keeps_fp32(
    tmp_path: Path,
) -> None:
    fill = "att.masked_fill(mask == 0, self.neg)"
    inf_on_purpose = _buffer_model(tmp_path, "float('-inf')", fill, "inf_on_purpose.py")
    assert [f.code for f in scanned(inf_on_purpose, mode="half").findings] == []
    beyond = _buffer_model(tmp_path, "-1e10", fill, "beyond.py")
    assert "NH005" not in [f.code for f in scanned(beyond).findings]


def test_a_mask_constant_beyond_fp16_in_half_mode_is_reported_and_the_scan_goes_on_in_fp16(
    tmp_path: Path,
) -> None:
    """Real FP16 raises at ``masked_fill(m, -1e9)``; the scan reports it and goes on with the
    value saturated (-inf in FP16), so the next matmul, on FP16 weights, gets an FP16 operand
    (an FP32 one would make it raise a dtype mismatch of the scan's own making)."""
    path = _buffer_model(tmp_path, "0.0", "att.masked_fill(mask == 0, -1e9)")
    report = scanned(path, mode="half")
    errors = [f for f in report.findings if f.is_error]
    assert [(f.code, f.op) for f in errors] == [("NH104", "Tensor.masked_fill")]
    (out,) = errors[0].outputs
    assert (out.dtype, out.neginf) == ("float16", 2 * 15)  # the 15 above the diagonal
    assert errors[0].fix is not None and errors[0].fix.verified is True
    assert "torch.finfo(att.dtype).min" in (errors[0].fix.diff or "")
