"""Public precision bugs on real code, found by the precision check at the right op and line
(issue 39). The models are transformers' own (random weights, no downloads) with a module put
back to its pre-fix form, and published layers (``tests/real_precision/models.py``):

- Llama's rotary ``inv_freq @ position_ids`` under autocast (transformers 4.38): NH601 at the
  matmul, the positions past 256 cast to BF16;
- GPT-NeoX's rotary cache ``torch.arange(seq_len, dtype=self.inv_freq.dtype)`` in a
  ``model.to(torch.bfloat16)`` model (transformers <= 4.35, Falcon alike): NH601 at the arange;
- a hand-written LayerNorm, ``E[x^2] - E[x]^2``, in a BF16 BERT whose embeddings have an offset:
  NH602 at the subtraction;
- causal linear attention's two ``cumsum`` over 4096 positions in a BF16 model (lucidrains'
  ``causal_linear_attn``): NH603 at each;
- today's Llama rotary embedding in a ``model.to(torch.bfloat16)`` model: its ``inv_freq``
  buffer is rounded, NH609 at ``cos`` and ``sin``.

The same models with the shipped module (or ``nn.LayerNorm``) have no NH6xx
finding, nor have the 43 architectures of ``tests/test_real_models.py`` in BF16, nor six
decoders over 512 positions. All ``slow`` (about 80 s on 2 cores):
``python -m pytest -q -m slow -n 0 tests/test_real_precision.py -s``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from nan_hunter.findings import Report
from tests.conftest import marker_line
from tests.real_precision import models as real
from tests.test_real_models import (
    ARCHITECTURES,
    _architecture,
    _built,
    _model_loss,
    _scan,
    _transformers,
)

MODELS = Path(real.__file__).resolve()
SEQ = 512
"""Rotary positions up to 511: past BF16's 256, inside the tiny configs' 1024 positions."""


def _lm_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 1000, (1, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}


def _llama(prefix: bool) -> tuple[nn.Module, Any, dict[str, Any]]:
    tf = _transformers()
    batch = _lm_batch()

    def build() -> nn.Module:
        tf.set_seed(0)
        config = tf.LlamaConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=1024,
        )  # fmt: skip
        model = tf.LlamaForCausalLM(config).eval()
        return real.with_rotary_forward(model, real.autocast_rotary_forward) if prefix else model

    return _built("LlamaForCausalLM", build, batch), batch, {}


def _gpt_neox(prefix: bool) -> tuple[nn.Module, Any, dict[str, Any]]:
    tf = _transformers()
    batch = _lm_batch()

    def build() -> nn.Module:
        tf.set_seed(0)
        config = tf.GPTNeoXConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=1024,
        )  # fmt: skip
        model = tf.GPTNeoXForCausalLM(config).eval()
        return real.with_rotary_forward(model, real.cached_rotary_forward) if prefix else model

    return _built("GPTNeoXForCausalLM", build, batch), batch, {"mode": "half"}


def _bert_naive_norm(prefix: bool) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The offset 0.5 keeps the BF16 variance positive (1 and more make some negative: a NaN
    at the ``sqrt``, NH202, blamed on the same subtraction) and the embeddings' own rounding
    within what ``nn.LayerNorm`` takes without a jump (at 8 the sum of the embeddings rounds
    their differences away and ``layer_norm`` itself jumps: NH609)."""
    tf = _transformers()
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(2, 1000, (2, 16), generator=g),
             "labels": torch.tensor([0, 2])}  # fmt: skip

    def build() -> nn.Module:
        tf.set_seed(0)
        config = tf.BertConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=64, num_labels=3,
        )  # fmt: skip
        model = real.layer_norm_offset(tf.BertForSequenceClassification(config).eval(), 0.5)
        return real.with_naive_layer_norms(model) if prefix else model

    return _built("BertForSequenceClassification", build, batch), batch, {"mode": "half"}


def _linear_attention(prefix: bool) -> tuple[nn.Module, Any, dict[str, Any]]:
    assert prefix
    x = torch.randn(1, 4096, 16, generator=torch.Generator().manual_seed(0))
    return real.causal_linear_attention_model(), x, {"mode": "half"}


CASES: dict[str, tuple[Callable[[bool], tuple[nn.Module, Any, dict[str, Any]]], list[Any]]] = {
    # name: (builder, expected [(code, op, marker)])
    "llama-rotary-autocast": (_llama, [("NH601", "Tensor.__matmul__", "# <- rotary matmul")]),
    "gpt-neox-rotary-cache": (_gpt_neox, [("NH601", "torch.arange", "# <- cache positions")]),
    "bert-naive-layer-norm": (_bert_naive_norm, [("NH602", "Tensor.__sub__", "# <- variance")]),
    "causal-linear-attention": (_linear_attention, [
        ("NH603", "Tensor.cumsum", "# <- key cumsum"),
        ("NH603", "Tensor.cumsum", "# <- context cumsum"),
    ]),
}  # fmt: skip


def _precision(report: Report) -> list[tuple[str, str, str, int]]:
    return [
        (f.code, f.op, str(Path(f.location.file).resolve()) if f.location else "",
         f.location.line if f.location else 0)
        for f in report.findings if f.code.startswith("NH6")
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_found_at_the_op_and_line(name: str) -> None:
    builder, expected = CASES[name]
    model, batch, options = builder(True)
    loss_fn = None if isinstance(batch, torch.Tensor) else _model_loss
    report = _scan(f"{name} bfloat16", model, batch, loss_fn, dtype="bfloat16", **options)
    assert _precision(report) == [
        (code, op, str(MODELS), marker_line(MODELS, marker)) for code, op, marker in expected
    ]
    assert report.precision_check is not None and report.precision_check.compared > 10
    for f in report.findings:  # NH601 names what the rounded positions ruin: the rotary cos
        if f.code == "NH601":
            assert f"; Tensor.cos at {MODELS.name}:" in f.message, f.message


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if n != "causal-linear-attention"])
def test_the_shipped_module_is_clean(name: str) -> None:
    builder, _ = CASES[name]
    model, batch, options = builder(False)
    report = _scan(f"{name} shipped bfloat16", model, batch, _model_loss, dtype="bfloat16",
                   **options)  # fmt: skip
    assert _precision(report) == []
    verdict = report.precision_check
    assert verdict is not None and verdict.grad_cosine is not None and verdict.grad_cosine > 0.99


def _source_line(function: Any, code: str) -> tuple[str, int]:
    """The file and line of the one line of ``function`` that starts with ``code``."""
    lines, start = inspect.getsourcelines(function)
    (line,) = [start + i for i, text in enumerate(lines) if text.strip().startswith(code)]
    return str(Path(inspect.getsourcefile(function) or "").resolve()), line


@pytest.mark.slow
def test_rotary_inv_freq_rounded_by_model_to_bfloat16() -> None:
    """Today's Llama rotary embedding multiplies in FP32, ``position_ids.float() *
    self.inv_freq.to(torch.float)``, but ``inv_freq`` is a buffer: ``model.to(torch.bfloat16)``
    (``mode="half"``) has rounded it to BF16 already, so at positions near 511 the angles are
    off by up to ~0.5 rad and ``cos``/``sin`` by ~9% of their range, against 0.02% for the
    angles themselves (an absolute error their relative error hides). Reported where the loss
    shows, NH609 at ``cos`` and ``sin``: the rounding is the buffer's cast, outside the
    forward."""
    _transformers()
    from transformers.models.llama import modeling_llama

    model, batch, _ = _llama(False)
    report = _scan("llama half bfloat16", model, batch, _model_loss, dtype="bfloat16", mode="half")
    forward = modeling_llama.LlamaRotaryEmbedding.forward
    forward = getattr(forward, "__wrapped__", forward)  # under @dynamic_rope_update
    assert _precision(report) == [
        ("NH609", "Tensor.cos", *_source_line(forward, "cos = emb.cos()")),
        ("NH609", "Tensor.sin", *_source_line(forward, "sin = emb.sin()")),
    ]


# ---------------------------------------------------------------------------------------------
# no false positive: the clean architectures in BF16


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_clean_architectures_have_no_precision_finding_in_bfloat16(name: str) -> None:
    """``tests/test_real_models.py``'s 43 architectures (random weights, sequence 16), BF16
    autocast, the precision check at its default thresholds: no NH6xx finding."""
    model, batch = _architecture(name)
    report = _scan(f"{name} bfloat16", model, batch, _model_loss, dtype="bfloat16")
    assert [(f.code, f.op, f.message) for f in report.findings if f.code.startswith("NH6")] == []
    assert report.precision_check is not None and report.precision_check.compared > 20


LONG_DECODERS = ("llama", "gpt_neox", "falcon", "bloom", "phi", "gemma")
"""Rotary (Llama, GPT-NeoX, Falcon, Phi's partial, Gemma) and ALiBi (BLOOM) positions."""


@pytest.mark.slow
@pytest.mark.parametrize("name", LONG_DECODERS)
def test_decoders_at_512_positions_have_no_precision_finding_in_bfloat16(name: str) -> None:
    """The decoders over positions past BF16's exact 256, under autocast: transformers keeps
    the positions and angles in FP32, so no NH601 (nor another NH6xx)."""
    tf = _transformers()
    config_class, model_class, options, _ = ARCHITECTURES[name]
    options = {**options, "max_position_embeddings": 1024}

    def build() -> nn.Module:
        tf.set_seed(0)
        return getattr(tf, model_class)(getattr(tf, config_class)(**options)).eval()

    batch = _lm_batch()
    model = _built(model_class, build, batch)
    report = _scan(f"{name} {SEQ} bfloat16", model, batch, _model_loss, dtype="bfloat16")
    assert [(f.code, f.op, f.message) for f in report.findings if f.code.startswith("NH6")] == []
