"""Real architectures, built from their libraries' own code with random weights (no downloads).

Small configs (2 layers, hidden 64, vocab 1000, sequence 16, batch 2) keep the whole file near
40 s on 2 cores. Every test is ``slow``: ``pytest -m "not slow"`` leaves them out,
``pytest -q -m slow tests/test_real_models.py -s`` runs them and prints what each scan reported.

- BERT, GPT-2 and T5 as they ship, under emulated CUDA FP16 autocast: no error. T5's
  ``torch.log(0) = -inf`` in ``_relative_position_bucket`` (in FP32 too) only reaches an integer
  cast: it is reported at info severity as contained.
- T5 provoked: feed-forward weights of layer 0 scaled until the activation passes 65504 gives
  the FP16 overflow at the exact ``DenseReluDense`` linear.
- BERT in ``mode="half"`` with a padded attention mask: clean, for the reason checked in the test.
- torchvision's resnet18 and a tiny ViT (skipped where torchvision does not import).
- 43 transformers architectures (``ARCHITECTURES``: encoders, decoders, encoder-decoders,
  XLNet, Perceiver, Reformer, vision transformers, convolutional networks, Whisper, Wav2Vec2,
  CLIP) have no error finding under CUDA's FP16 autocast policy; those whose CPU paths read
  memory they fill in part (SDPA, depthwise and grouped convolutions), or draw random hashes,
  are scanned three times: 57 scans, about 10 s on 2 cores. Their scaled variants (one inner
  layer past FP16's range, the verified fix keeping only the submodule around it) are in
  ``tests/test_real_library_submodule_fix.py``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nan_hunter
from nan_hunter.findings import Finding, Kind, Phase, Report, Severity

FP16_MAX = 65504.0
VOCAB, BATCH, SEQ = 1000, 2, 16


# ---------------------------------------------------------------------------------------------
# helpers


def _transformers() -> Any:
    return pytest.importorskip(
        "transformers", reason="transformers is not installed: the real-model tests build from it"
    )


def _torchvision() -> Any:
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        pass  # importorskip below skips with the reason
    except Exception as exc:  # a wheel built for another torch: torchvision::nms does not exist
        pytest.skip(
            f"torchvision is installed but does not import beside torch {torch.__version__}: "
            f"{type(exc).__name__}: {exc}"
        )
    return pytest.importorskip(
        "torchvision",
        reason=(
            "torchvision is not installed: PyPI's torchvision does not import beside the "
            "torch 2.13.0 CPU build this project pins (operator torchvision::nms does not exist)"
        ),
    )


def _built(name: str, build: Callable[[], nn.Module], batch: Any) -> nn.Module:
    """``build()`` and one plain FP32 forward outside nan-hunter: a failure here is a
    library/torch incompatibility, not a nan-hunter bug, and skips the test with its reason."""
    try:
        model = build()
        with torch.no_grad():
            if isinstance(batch, dict):
                model(**batch)
            else:
                model(batch)
    except Exception as exc:
        pytest.skip(
            f"{name} does not build or run with torch {torch.__version__} here: "
            f"{type(exc).__name__}: {exc}"
        )
    return model


def _model_loss(output: Any, batch: Any) -> torch.Tensor:
    """The loss a Hugging Face model computes itself from ``labels``."""
    return output.loss


def _scan(name: str, model: nn.Module, batch: Any, loss_fn: Any = None, **options: Any) -> Report:
    started = time.perf_counter()
    report = nan_hunter.scan(model, batch, loss_fn, **options)
    wall = time.perf_counter() - started
    print(
        f"\n[{name}] {report.status}: {report.errors} errors, {report.warnings} warnings, "
        f"{report.ops} ops, {report.backward_nodes} backward nodes, scan {report.seconds:.2f}s "
        f"(wall {wall:.2f}s), mode {report.target.mode}"
    )
    for f in report.findings:
        where = f"{Path(f.location.file).name}:{f.location.line}" if f.location else "-"
        print(
            f"  {f.code} {f.severity.value} {f.kind.value} {f.phase.value} {f.op} "
            f"[{f.module or '(root)'}] {where}"
        )
    return report


def _errors(report: Report) -> list[Finding]:
    return [f for f in report.findings if f.severity is Severity.ERROR]


def _text_batch(*, labels: str) -> dict[str, torch.Tensor]:
    """input_ids / attention_mask (the second sequence half padding) / labels."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(2, VOCAB, (BATCH, SEQ), generator=g)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    attention_mask[1, SEQ // 2 :] = 0
    if labels == "class":
        target = torch.tensor([0, 2])
    else:  # token labels, -100 (ignored) on padding
        tokens = (
            input_ids if labels == "same" else torch.randint(2, VOCAB, (BATCH, SEQ), generator=g)
        )
        target = tokens.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": target}


def _bert(attn_implementation: str = "sdpa") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    tf = _transformers()
    batch = _text_batch(labels="class")

    def build() -> nn.Module:
        tf.set_seed(0)
        config = tf.BertConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
            num_labels=3,
            attn_implementation=attn_implementation,
        )
        return tf.BertForSequenceClassification(config).eval()

    model = _built(f"BertForSequenceClassification ({attn_implementation})", build, batch)
    assert model.config._attn_implementation == attn_implementation
    return model, batch


def _t5(feed_forward_proj: str = "relu") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    tf = _transformers()
    batch = _text_batch(labels="other")

    def build() -> nn.Module:
        tf.set_seed(0)
        config = tf.T5Config(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            feed_forward_proj=feed_forward_proj,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
        )
        return tf.T5ForConditionalGeneration(config).eval()

    return _built(f"T5ForConditionalGeneration ({feed_forward_proj})", build, batch), batch


def _is_t5_relative_position_log(f: Finding) -> bool:
    """T5's ``_relative_position_bucket``: ``torch.log(relative_position.float() / max_exact)``
    is ``log(0) = -inf`` at distance 0, in FP32 too; the value is cast to long and discarded by
    ``torch.where(is_small, ...)``, so it never reaches the model's output."""
    return (
        f.code == "NH301"
        and f.op == "torch.log"
        and f.module
        in {"encoder.block.0.layer.0.SelfAttention", "decoder.block.0.layer.0.SelfAttention"}
        and f.location is not None
        and Path(f.location.file).name == "modeling_t5.py"
        and "torch.log(relative_position.float() / max_exact)" in f.location.code
        and f.fp32_rerun is not None
        and not f.fp32_rerun.finite
    )


def _fp16_errors(report: Report) -> list[Finding]:
    """Error findings (T5's contained relative-position ``log(0)`` is info, not an error)."""
    return _errors(report)


# ---------------------------------------------------------------------------------------------
# 1. shipped models, FP16 autocast: no error finding


@pytest.mark.slow
def test_bert_is_clean_under_fp16_autocast() -> None:
    model, batch = _bert()
    report = _scan("bert autocast", model, batch, _model_loss)
    assert report.errors == 0, [f.message for f in _errors(report)]
    assert report.target.mode == "autocast" and report.target.dtype == "float16"
    assert report.ops > 40 and report.backward_nodes > 0
    assert report.loss is not None and report.loss.nan == 0 and report.loss.posinf == 0
    _assert_clean_under_gradscaler(report)
    # without loss scaling, the backward's gradients underflow in the Linear layers (NH402)
    unscaled = _scan("bert autocast unscaled", model, batch, _model_loss, grad_scale="none")
    assert {f.code for f in unscaled.findings} == {"NH402"}


@pytest.mark.slow
def test_gpt2_lm_head_with_labels_is_clean_under_fp16_autocast() -> None:
    tf = _transformers()
    batch = _text_batch(labels="same")

    def build() -> nn.Module:
        tf.set_seed(0)
        config = tf.GPT2Config(
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=VOCAB - 1,
            eos_token_id=VOCAB - 1,
        )
        return tf.GPT2LMHeadModel(config).eval()

    model = _built("GPT2LMHeadModel", build, batch)
    report = _scan("gpt2 autocast", model, batch, _model_loss)
    assert report.errors == 0, [f.message for f in _errors(report)]
    assert report.ops > 40 and report.backward_nodes > 0
    assert report.loss is not None and report.loss.nan == 0 and report.loss.posinf == 0
    _assert_clean_under_gradscaler(report)


def _assert_clean_under_gradscaler(report: Report) -> None:
    """No finding at all, warnings included, under the default: GradScaler's 2**16, dynamic."""
    assert report.findings == (), [(f.code, f.module, f.message[:80]) for f in report.findings]
    scaling = report.target.loss_scaling
    assert scaling is not None
    assert (scaling.policy, scaling.initial, scaling.used) == ("dynamic", 2.0**16, 2.0**16)


@pytest.fixture(scope="module")
def t5_report() -> Report:
    model, batch = _t5()
    return _scan("t5 autocast", model, batch, _model_loss)


@pytest.mark.slow
def test_t5_has_no_fp16_error_under_autocast(t5_report: Report) -> None:
    assert t5_report.errors == 0, [f.message for f in _errors(t5_report)]
    assert t5_report.ops > 200 and t5_report.backward_nodes > 0
    assert t5_report.loss is not None and t5_report.loss.nan == 0 and t5_report.loss.posinf == 0
    # The -inf of log(0) in the relative-position bucket of the one block that owns the position
    # bias, encoder and decoder: real (FP32 too) but contained, so info severity.
    logs = [f for f in t5_report.findings if _is_t5_relative_position_log(f)]
    assert [f.module for f in logs] == [
        "encoder.block.0.layer.0.SelfAttention",
        "decoder.block.0.layer.0.SelfAttention",
    ]
    assert all(f.severity is Severity.INFO for f in logs)
    assert all(f.notes and f.notes[0].startswith("contained:") for f in logs)
    assert all(f.kind is Kind.INF and f.phase is Phase.FORWARD for f in logs)


# ---------------------------------------------------------------------------------------------
# 2. known failures, provoked


def _max_output(module: nn.Module, run: Callable[[], Any], *, inputs: bool = False) -> float:
    """The largest |x| of ``module``'s output (or first input) in a plain FP32 forward."""
    seen: list[float] = []

    def hook(mod: nn.Module, args: tuple[Any, ...], out: Any = None) -> None:
        seen.append((args[0] if inputs else out).detach().abs().max().item())

    handle = (
        module.register_forward_pre_hook(hook) if inputs else module.register_forward_hook(hook)
    )
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return max(seen)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("feed_forward_proj", "scaled", "factor", "code", "culprit", "statement"),
    [
        # T5DenseActDense: wi's own result passes 65504, an FP16 linear result (NH102)
        ("relu", ("wi",), 1e5, "NH102", "wi", "hidden_states = self.wi(hidden_states)"),
        # T5DenseGatedActDense (T5 v1.1 / Flan-T5): gelu_new(wi_0 x) * wi_1 x is FP32 (gelu_new's
        # torch.pow is on CUDA autocast's FP32 list and promotes the product); each factor stays
        # below 65504, the product does not: autocast casts it to FP16 at wo (NH101), the
        # overflow for which transformers keeps T5's `wo` in FP32 (`_keep_in_fp32_modules`).
        (
            "gated-gelu",
            ("wi_0", "wi_1"),
            300.0,
            "NH101",
            "wo",
            "hidden_states = self.wo(hidden_states)",
        ),
    ],
    ids=["relu-wi", "gated-gelu-product"],
)
def test_t5_feed_forward_overflow_is_found_in_dense_relu_dense(
    feed_forward_proj: str,
    scaled: tuple[str, ...],
    factor: float,
    code: str,
    culprit: str,
    statement: str,
) -> None:
    model, batch = _t5(feed_forward_proj)
    dense = model.encoder.block[0].layer[-1].DenseReluDense
    assert type(dense).__name__ == (
        "T5DenseActDense" if feed_forward_proj == "relu" else "T5DenseGatedActDense"
    )
    with torch.no_grad():
        for name in scaled:
            getattr(dense, name).weight.mul_(factor)

    def forward() -> None:
        model(**batch)

    # the provocation works: in FP32 the activation reaching/leaving the culprit passes 65504
    if culprit == "wo":
        assert _max_output(dense.wo, forward, inputs=True) > FP16_MAX
        assert max(_max_output(getattr(dense, n), forward) for n in scaled) < FP16_MAX
    else:
        assert _max_output(getattr(dense, culprit), forward) > FP16_MAX

    report = _scan(
        f"t5 {feed_forward_proj} x{factor:g} {'/'.join(scaled)}", model, batch, _model_loss
    )
    errors = _fp16_errors(report)
    assert len(errors) == 1, [f"{f.code} {f.op} {f.module}" for f in errors]
    finding = errors[0]
    assert finding.code == code
    assert finding.kind is Kind.OVERFLOW and finding.phase is Phase.FORWARD and finding.origin
    assert finding.op == "torch.nn.functional.linear"
    assert finding.module == f"encoder.block.0.layer.1.DenseReluDense.{culprit}"
    assert finding.location is not None
    assert Path(finding.location.file).name == "modeling_t5.py"
    assert finding.location.code.strip() == statement
    # a precision problem: the same op is finite, above FP16's range, in the FP32 run
    assert finding.fp32_rerun is not None and finding.fp32_rerun.finite
    assert finding.fp32_rerun.abs_max is not None and finding.fp32_rerun.abs_max > FP16_MAX


@pytest.mark.slow
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_bert_half_mode_with_padding_mask_is_clean(attn_implementation: str) -> None:
    """Older BERT code added ``(1 - mask) * -10000`` or a mask built with
    ``torch.finfo(torch.float32).min``, which is -inf once cast to FP16 (NaN for a fully masked
    row). transformers 5.x builds the mask in ``masking_utils``: for eager attention with
    ``torch.finfo(dtype).min`` of the (half) embeddings, -65504, finite in FP16; for sdpa a
    boolean mask, no additive value at all. So a half-precision BERT with padding scans clean."""
    model, batch = _bert(attn_implementation)
    masks: list[torch.Tensor] = []
    attention = model.bert.encoder.layer[0].attention.self
    handle = attention.register_forward_pre_hook(
        lambda mod, args, kwargs: masks.append(kwargs["attention_mask"]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            copy.deepcopy(model).half()(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            )
    finally:
        handle.remove()
    (mask,) = masks
    if attn_implementation == "eager":
        assert mask.dtype == torch.float16
        assert set(mask.unique().tolist()) == {torch.finfo(torch.float16).min, 0.0}
    else:
        assert mask.dtype == torch.bool and not bool(mask.all())

    report = _scan(f"bert half {attn_implementation}", model, batch, _model_loss, mode="half")
    assert report.target.mode == "half"
    assert report.errors == 0, [f.message for f in _errors(report)]
    assert report.loss is not None and report.loss.nan == 0 and report.loss.posinf == 0
    assert {f.code for f in report.findings} <= {"NH402", "NH501", "NH502"}


# ---------------------------------------------------------------------------------------------
# 3. torchvision


def _image_batch() -> tuple[torch.Tensor, Callable[[torch.Tensor, Any], torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH, 3, 32, 32, generator=g)
    target = torch.tensor([1, 7])

    def loss_fn(output: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(output, target)

    return images, loss_fn


@pytest.mark.slow
def test_torchvision_resnet18_is_clean_under_fp16_autocast() -> None:
    tv = _torchvision()
    images, loss_fn = _image_batch()

    def build() -> nn.Module:
        torch.manual_seed(0)
        return tv.models.resnet18(weights=None, num_classes=10).train()

    model = _built("torchvision resnet18", build, images)
    report = _scan("resnet18 autocast (train)", model, images, loss_fn)
    assert report.errors == 0, [f.message for f in _errors(report)]
    assert report.ops > 60 and report.backward_nodes > 0
    assert {f.code for f in report.findings} <= {"NH402", "NH501", "NH502"}


@pytest.mark.slow
def test_torchvision_tiny_vit_is_clean_under_fp16_autocast() -> None:
    tv = _torchvision()
    images, loss_fn = _image_batch()

    def build() -> nn.Module:
        torch.manual_seed(0)
        return tv.models.VisionTransformer(
            image_size=32,
            patch_size=8,
            num_layers=2,
            num_heads=4,
            hidden_dim=64,
            mlp_dim=128,
            num_classes=10,
        ).eval()

    model = _built("torchvision VisionTransformer", build, images)
    report = _scan("vit tiny autocast", model, images, loss_fn)
    assert report.errors == 0, [f.message for f in _errors(report)]
    assert report.ops > 20 and report.backward_nodes > 0
    assert {f.code for f in report.findings} <= {"NH402", "NH501", "NH502"}


# ---------------------------------------------------------------------------------------------
# 4. no false alarm across architectures (issue 38)

_TEXT = {"vocab_size": VOCAB}
_ENCODER = {
    **_TEXT, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "max_position_embeddings": 64,
}  # fmt: skip
_DECODER = {**_ENCODER, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1}
_VIT = {
    "image_size": 32, "patch_size": 8, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "num_labels": 3,
}  # fmt: skip

ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any], str]] = {
    # name: (config class, model class, config, batch: class / lm / seq2seq / image)
    "bert": ("BertConfig", "BertForSequenceClassification", {**_ENCODER, "num_labels": 3},
             "class"),
    "roberta": ("RobertaConfig", "RobertaForSequenceClassification",
                {**_ENCODER, "num_labels": 3, "pad_token_id": 1}, "class"),
    "distilbert": ("DistilBertConfig", "DistilBertForSequenceClassification",
                   {**_TEXT, "dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128,
                    "max_position_embeddings": 64, "num_labels": 3}, "class"),
    "albert": ("AlbertConfig", "AlbertForSequenceClassification",
               {**_ENCODER, "embedding_size": 32, "num_labels": 3}, "class"),
    "electra": ("ElectraConfig", "ElectraForSequenceClassification",
                {**_ENCODER, "embedding_size": 32, "num_labels": 3}, "class"),
    "xlnet": ("XLNetConfig", "XLNetForSequenceClassification",
              {**_TEXT, "d_model": 64, "n_layer": 2, "n_head": 4, "d_inner": 128,
               "num_labels": 3}, "class"),
    "perceiver": ("PerceiverConfig", "PerceiverForSequenceClassification",
                  {**_TEXT, "num_latents": 8, "d_latents": 64, "d_model": 64, "num_blocks": 1,
                   "num_self_attends_per_block": 2, "num_self_attention_heads": 4,
                   "num_cross_attention_heads": 4, "max_position_embeddings": 64,
                   "num_labels": 3}, "perceiver"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             {**_TEXT, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
              "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1}, "lm"),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM",
                {**_TEXT, "hidden_size": 64, "num_layers": 2, "num_heads": 4,
                 "attention_types": [[["global", "local"], 1]], "window_size": 8,
                 "max_position_embeddings": 64}, "lm"),
    "opt": ("OPTConfig", "OPTForCausalLM",
            {**_TEXT, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "ffn_dim": 128, "word_embed_proj_dim": 64, "max_position_embeddings": 64,
             "pad_token_id": 0}, "lm"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {**_DECODER, "num_key_value_heads": 2}, "lm"),
    "reformer": ("ReformerConfig", "ReformerModelWithLMHead",
                 {**_TEXT, "hidden_size": 64, "num_attention_heads": 2,
                  "attention_head_size": 32, "attn_layers": ["local", "lsh"],
                  "feed_forward_size": 128, "axial_pos_shape": (4, 4),
                  "axial_pos_embds_dim": (32, 32), "max_position_embeddings": SEQ,
                  "local_attn_chunk_length": 8, "lsh_attn_chunk_length": 8, "num_buckets": 2,
                  "is_decoder": True, "pad_token_id": 0, "eos_token_id": 1}, "lm"),
    "t5": ("T5Config", "T5ForConditionalGeneration",
           {**_TEXT, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2,
            "num_decoder_layers": 2, "num_heads": 4, "decoder_start_token_id": 0,
            "pad_token_id": 0, "eos_token_id": 1}, "seq2seq"),
    "bart": ("BartConfig", "BartForConditionalGeneration",
             {**_TEXT, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
              "encoder_attention_heads": 4, "decoder_attention_heads": 4,
              "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_position_embeddings": 64,
              "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
              "decoder_start_token_id": 2}, "seq2seq"),
    "vit": ("ViTConfig", "ViTForImageClassification", _VIT, "image"),
    "efficientnet": ("EfficientNetConfig", "EfficientNetForImageClassification",
                     {"image_size": 32, "width_coefficient": 0.25, "depth_coefficient": 0.25,
                      "hidden_dim": 320, "num_labels": 3}, "image"),
    # --- added: more encoders
    "deberta_v2": ("DebertaV2Config", "DebertaV2ForSequenceClassification",
                   {**_ENCODER, "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                    "position_buckets": 8, "num_labels": 3}, "class"),
    "mpnet": ("MPNetConfig", "MPNetForSequenceClassification",
              {**_ENCODER, "num_labels": 3}, "class"),
    "funnel": ("FunnelConfig", "FunnelForSequenceClassification",
               {**_TEXT, "block_sizes": [1, 1], "d_model": 64, "n_head": 4, "d_head": 16,
                "d_inner": 128, "num_labels": 3}, "class"),
    "convbert": ("ConvBertConfig", "ConvBertForSequenceClassification",
                 {**_ENCODER, "embedding_size": 64, "num_labels": 3}, "class"),
    # --- added: more decoders
    "bloom": ("BloomConfig", "BloomForCausalLM",
              {**_TEXT, "hidden_size": 64, "n_layer": 2, "n_head": 4}, "lm"),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                {**_DECODER, "num_key_value_heads": 2, "sliding_window": 8}, "lm"),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               {**_TEXT, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
               "lm"),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             {**_TEXT, "n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8,
              "n_positions": 64, "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1}, "lm"),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM",
                {**_TEXT, "n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8,
                 "n_positions": 64, "n_ctx": 64, "bos_token_id": VOCAB - 1,
                 "eos_token_id": VOCAB - 1}, "lm"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {**_DECODER, "num_key_value_heads": 2}, "lm"),
    "phi": ("PhiConfig", "PhiForCausalLM", _DECODER, "lm"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              {**_DECODER, "num_key_value_heads": 2, "head_dim": 16}, "lm"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _DECODER, "lm"),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM",
                    {**_TEXT, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
                     "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1}, "lm"),
    # --- added: more encoder-decoders
    "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration",
                {**_TEXT, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
                 "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                 "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_position_embeddings": 64,
                 "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0},
                "seq2seq"),
    "marian": ("MarianConfig", "MarianMTModel",
               {**_TEXT, "decoder_vocab_size": VOCAB, "d_model": 64, "encoder_layers": 2,
                "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_position_embeddings": 64,
                "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0},
               "seq2seq"),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration",
                {**_TEXT, "num_mel_bins": 16, "d_model": 64, "encoder_layers": 2,
                 "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                 "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_source_positions": 16,
                 "max_target_positions": 64, "pad_token_id": 0, "bos_token_id": 1,
                 "eos_token_id": 1, "decoder_start_token_id": 1}, "speech"),
    # --- added: vision, audio, multimodal
    "deit": ("DeiTConfig", "DeiTForImageClassification", _VIT, "image"),
    "beit": ("BeitConfig", "BeitForImageClassification",
             {**_VIT, "use_relative_position_bias": True}, "image"),
    "dinov2": ("Dinov2Config", "Dinov2ForImageClassification", _VIT, "image"),
    "swin": ("SwinConfig", "SwinForImageClassification",
             {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1],
              "num_heads": [2, 4], "window_size": 4, "num_labels": 3}, "image"),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification",
                 {"num_stages": 2, "hidden_sizes": [16, 32], "depths": [1, 1], "num_labels": 3},
                 "image"),
    "resnet": ("ResNetConfig", "ResNetForImageClassification",
               {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1],
                "layer_type": "basic", "num_labels": 3}, "image"),
    "regnet": ("RegNetConfig", "RegNetForImageClassification",
               {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1],
                "groups_width": 8, "num_labels": 3}, "image"),
    "mobilenet_v2": ("MobileNetV2Config", "MobileNetV2ForImageClassification",
                     {"image_size": 32, "depth_multiplier": 0.25, "num_labels": 3}, "image"),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification",
                 {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "intermediate_size": 128, "conv_dim": (16, 16), "conv_stride": (5, 2),
                  "conv_kernel": (10, 3), "num_conv_pos_embeddings": 16,
                  "num_conv_pos_embedding_groups": 4, "num_labels": 3}, "audio"),
    "clip": ("CLIPConfig", "CLIPModel",
             {"text_config": {**_ENCODER, "pad_token_id": 1, "bos_token_id": 0,
                              "eos_token_id": VOCAB - 1},
              "vision_config": {k: v for k, v in _VIT.items() if k != "num_labels"},
              "projection_dim": 32}, "clip"),
}  # fmt: skip
"""Small configs (2 layers, width 64; convolutional networks 2 stages of 16 and 32 channels) of
architectures that build offline from transformers."""

FLAKY_PRONE = ("bert", "efficientnet", "reformer", "convbert", "convnext", "regnet",
               "mobilenet_v2")  # fmt: skip
"""Scanned three times: their CPU paths allocate memory they fill in part (SDPA's kernel, the
depthwise or grouped convolutions of EfficientNet, ConvBERT, ConvNeXt, RegNet and MobileNetV2)
or draw random hashes (Reformer's LSH attention)."""


def _architecture(name: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    tf = _transformers()
    config_class, model_class, options, kind = ARCHITECTURES[name]
    g = torch.Generator().manual_seed(0)
    if kind == "image":
        batch = {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g),
                 "labels": torch.tensor([0, 2])}  # fmt: skip
    elif kind == "audio":  # 400 samples of a waveform, one label per clip
        batch = {"input_values": torch.randn(BATCH, 400, generator=g),
                 "labels": torch.tensor([0, 2])}  # fmt: skip
    elif kind == "speech":  # log-mel features (2 x max_source_positions frames), token labels
        batch = {"input_features": torch.randn(BATCH, 16, 32, generator=g),
                 "labels": torch.randint(2, VOCAB, (BATCH, SEQ), generator=g)}  # fmt: skip
    elif kind == "clip":  # text and images, the contrastive loss of the model itself
        batch = _text_batch(labels="class")
        del batch["labels"]
        batch["pixel_values"] = torch.randn(BATCH, 3, 32, 32, generator=g)
        batch["return_loss"] = True
    else:
        batch = _text_batch(labels={"lm": "same", "seq2seq": "other"}.get(kind, "class"))
        if kind == "perceiver":
            batch["inputs"] = batch.pop("input_ids")
        if name == "reformer":  # a causal LM head: labels are the inputs, no padding to ignore
            batch["labels"] = batch["input_ids"]

    def build() -> nn.Module:
        tf.set_seed(0)
        config = getattr(tf, config_class)(**options)
        model = getattr(tf, model_class)(config)
        # Reformer's reversible layers recompute their forward only in training mode (its
        # backward asserts it); the others run in eval mode, no dropout
        return model.train() if name == "reformer" else model.eval()

    return _built(name, build, batch), batch


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "run"),
    [(name, run) for name in ARCHITECTURES for run in range(3 if name in FLAKY_PRONE else 1)],
    ids=lambda v: str(v),
)
def test_clean_architectures_have_no_error_under_fp16_autocast(name: str, run: int) -> None:
    """Every architecture, random weights, CUDA's FP16 autocast policy: no crash, no error
    finding, so no exit 1 (XLNet's absorbed ``1e30 * mask`` is a warning, MPNet's relative
    position ``log(0)`` contained info; Perceiver's expanded latents and Reformer's recomputed
    layers are seen)."""
    model, batch = _architecture(name)
    report = _scan(f"{name} autocast #{run}", model, batch, _model_loss)
    assert report.errors == 0, [(f.code, f.op, f.module, f.message[:80]) for f in _errors(report)]
    assert report.exit_code() == 0
    assert report.ops > 20 and report.backward_nodes > 0
    assert report.loss is not None and report.loss.finite
    assert not any(f.code == "NH003" for f in report.findings)
    assert not any(f.op in ("torch.empty", "torch.empty_like", "Tensor.new_empty")
                   for f in report.findings)  # fmt: skip


@pytest.mark.slow
def test_gpt2_and_bert_have_no_precision_finding_in_bfloat16() -> None:
    """The precision check's false positives: small GPT-2 and BERT configurations, random
    weights, scanned in BF16 (the check runs by default there) have no NH6xx finding at the
    default thresholds, and their loss and gradients stay close to FP32's."""
    tf = _transformers()
    batch = _text_batch(labels="same")

    def build() -> nn.Module:
        tf.set_seed(0)
        config = tf.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
            bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
        )
        return tf.GPT2LMHeadModel(config).eval()

    gpt2 = _built("GPT2LMHeadModel", build, batch)
    bert, bert_batch = _bert()
    for name, model, data in (("gpt2", gpt2, batch), ("bert", bert, bert_batch)):
        report = _scan(f"{name} bfloat16", model, data, _model_loss, dtype="bfloat16")
        assert [f.code for f in report.findings if f.code.startswith("NH6")] == [], name
        verdict = report.precision_check
        assert verdict is not None and verdict.compared > 40, name
        print(f"  precision vs FP32: {verdict.render()}")
        assert verdict.loss_error is not None and verdict.loss_error < 0.05, name
        assert verdict.grad_cosine is not None and verdict.grad_cosine > 0.99, name
