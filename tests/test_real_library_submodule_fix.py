"""Real transformers architectures (small configs, random weights, no downloads), one layer
scaled until it overflows FP16: the verified fix keeps no more than the submodule around that
layer in FP32, from the user's ``build_model()``, instead of the whole model. ``slow``."""

from __future__ import annotations

from pathlib import Path

import pytest

from nan_hunter.api import scan_file

BERT = """\
import torch
from transformers import BertConfig, BertForSequenceClassification


def build_model():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.bert.encoder.layer[1].intermediate.dense.weight.mul_(1.5e5)
    return model


def sample_batch():
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (2, 16))
    labels = torch.tensor([0, 1])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def loss_fn(output, batch):
    return output.loss
"""

GPT2 = """\
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build_model():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.mul_(1.5e5)
    return model


def sample_batch():
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (2, 16))
    return {"input_ids": ids, "labels": ids}


def loss_fn(output, batch):
    return output.loss
"""

T5 = """\
import torch
from transformers import T5Config, T5ForConditionalGeneration


def build_model():
    torch.manual_seed(0)
    config = T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                      num_decoder_layers=2, num_heads=4, dropout_rate=0.0,
                      decoder_start_token_id=0)
    model = T5ForConditionalGeneration(config)
    with torch.no_grad():
        model.encoder.block[1].layer[1].DenseReluDense.wi.weight.mul_(3e4)
    return model


def sample_batch():
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (2, 16))
    return {"input_ids": ids, "labels": ids}


def loss_fn(output, batch):
    return output.loss
"""

MODELS = {
    "bert": (BERT, "bert.encoder.layer.1.intermediate.dense", "bert.encoder.layer.1"),
    "gpt2": (GPT2, "transformer.h.1.mlp.c_fc", "transformer.h.1.mlp"),
    "t5": (T5, "encoder.block.1.layer.1.DenseReluDense.wi",
           "encoder.block.1.layer.1.DenseReluDense"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_the_verified_fix_keeps_only_the_overflowing_layers_submodule(
    name: str, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    source, culprit, kept = MODELS[name]
    model = tmp_path / f"{name}_model.py"
    model.write_text(source)
    report = scan_file(str(model))
    (finding,) = [f for f in report.findings if f.is_error]
    assert (finding.code, finding.module) == ("NH102", culprit)
    fix = finding.fix
    assert fix is not None
    assert (fix.verified, fix.remaining, fix.fp32_module) == (True, (), kept)
    assert fix.files == (str(model),)
    assert fix.cost is not None and fix.cost.fp32_matmul_share < 0.5  # before: 1.0
