"""Half mode (model.half()), BF16 scans, and the 'BF16 would avoid this' alternative."""

from __future__ import annotations

import torch

from nan_hunter.api import scan
from nan_hunter.loader import load_target
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
