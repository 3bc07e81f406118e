"""A ``-inf`` that FP32 makes by design and a softmax absorbs (GPT-Neo's two ``finfo.min``
masks added) is no real bug: it appears once a fix computes the scores in FP32, and must not
refute that fix as a new NH301."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from nan_hunter.api import scan_file
from tests.conftest import FIXTURES, marker_line

NEO_STYLE = FIXTURES / "neo_style_mask.py"


def test_the_fix_that_makes_the_scores_fp32_is_verified() -> None:
    # Before: "NOT verified ... NH301 Tensor.__add__ at line 24 (new: the original scan did
    # not have it)" for every candidate.
    report = scan_file(str(NEO_STYLE))
    (finding,) = [f for f in report.findings if f.is_error]
    assert finding.location is not None
    assert (finding.code, finding.op, finding.location.line) == (
        "NH102", "Tensor.__matmul__", marker_line(NEO_STYLE, "# <- culprit")
    )
    fix = finding.fix
    assert fix is not None
    assert (fix.title, fix.verified, fix.remaining) == (
        "Compute Tensor.__matmul__ in FP32 (autocast disabled)", True, ()
    )


def test_the_absorbed_fp32_minus_inf_is_not_reported(tmp_path: Path) -> None:
    """The model as fixed: the scores are FP32, the mask sum is -inf in both passes, the
    softmax takes it in. Clean, not NH301 at the addition."""
    fixed = tmp_path / "fixed.py"
    fixed.write_text(NEO_STYLE.read_text().replace(
        "scores = q @ k.transpose(-1, -2)  # <- culprit",
        "with torch.autocast(device_type='cuda', enabled=False):\n"
        "            scores = q.float() @ k.transpose(-1, -2).float()",
    ))
    report = scan_file(str(fixed), verify=False)
    assert [(f.code, f.op) for f in report.findings if f.is_error] == []
    assert report.status == "clean"


def test_a_minus_inf_that_reaches_the_loss_is_still_a_real_bug(tmp_path: Path) -> None:
    model = tmp_path / "escapes.py"
    model.write_text(textwrap.dedent(
        """\
        import torch
        from torch import nn


        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                low = torch.full_like(x, torch.finfo(torch.float32).min)
                s = self.fc(x).float() + low + low
                return s.mean()


        def build_model() -> nn.Module:
            torch.manual_seed(0)
            return Model()


        def sample_batch() -> torch.Tensor:
            torch.manual_seed(0)
            return torch.randn(2, 4)
        """
    ))
    report = scan_file(str(model), verify=False)
    assert [(f.code, f.op, f.location.line if f.location else None)
            for f in report.findings if f.is_error] == [("NH301", "Tensor.__add__", 12)]


@pytest.mark.slow
def test_gpt_neo_fix_is_not_refuted_by_its_own_fp32_mask(tmp_path: Path) -> None:
    """transformers' GPT-Neo (small config, random weights), layer 0's MLP scaled so that its
    ``c_fc`` overflows FP16: the fix that runs the library call in FP32 makes the attention's
    mask sum ``-inf`` (absorbed by its softmax); before, that refuted it as NH301."""
    pytest.importorskip("transformers")
    model = tmp_path / "neo.py"
    model.write_text(textwrap.dedent(
        """\
        import torch
        from torch import nn
        from transformers import GPTNeoConfig, GPTNeoForCausalLM


        class LM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                config = GPTNeoConfig(
                    vocab_size=1000, max_position_embeddings=32, hidden_size=64, num_layers=2,
                    attention_types=[[["global", "local"], 1]], num_heads=4,
                    intermediate_size=128, window_size=8, attention_dropout=0.0,
                    resid_dropout=0.0, embed_dropout=0.0, bos_token_id=0, eos_token_id=0,
                )
                self.lm = GPTNeoForCausalLM(config)

            def forward(self, ids: torch.Tensor) -> torch.Tensor:
                out = self.lm(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
                return out.loss


        def build_model() -> nn.Module:
            torch.manual_seed(0)
            model = LM()
            with torch.no_grad():
                model.lm.transformer.h[0].mlp.c_fc.weight.mul_(2e5)
            return model


        def sample_batch() -> torch.Tensor:
            torch.manual_seed(0)
            return torch.randint(0, 1000, (2, 16))
        """
    ))
    report = scan_file(str(model))
    (finding,) = [f for f in report.findings if f.is_error]
    assert (finding.code, finding.op, finding.module) == (
        "NH102", "torch.nn.functional.linear", "lm.transformer.h.0.mlp.c_fc"
    )
    assert finding.fix is not None
    assert (finding.fix.verified, finding.fix.remaining) == (True, ())
    assert not any("NH301" in r for f in (finding.fix, *finding.fix.alternatives)
                   for r in f.remaining)
