"""Deterministic benchmark models for ``benchmarks/overhead.py``.

Every ``build_<name>(quick=False)`` returns ``(model, batch)``: a model in train mode whose
parameters require grad, and a batch (one float tensor) it is called with as ``model(batch)``.
The same seed gives bit-identical weights and inputs in every process, so the memory
subprocesses measure the very model the timing loop ran. All models are clean under FP16
autocast: activations stay far from the FP16 range limits.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

Built = tuple[nn.Module, torch.Tensor]


class SelfAttention(nn.Module):
    """Multi-head self-attention written out by hand: q/k/v projections, scaled scores,
    softmax, weighted sum, output projection."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not a multiple of heads {heads}")
        self.heads = heads
        self.d_head = d_model // heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.d_head).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        weights = torch.softmax(scores, dim=-1)
        mixed = (weights @ v).transpose(1, 2).reshape(b, t, d)
        return self.out(mixed)


class EncoderLayer(nn.Module):
    """Pre-LN transformer encoder layer: ``x + attn(ln(x))``, then ``x + ffn(ln(x))``."""

    def __init__(self, d_model: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ffn)
        self.fc2 = nn.Linear(ffn, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Module):
    """Float features -> linear input projection -> ``layers`` pre-LN layers -> LN -> head."""

    def __init__(
        self, *, features: int, d_model: int, heads: int, ffn: int, layers: int, classes: int
    ) -> None:
        super().__init__()
        self.proj = nn.Linear(features, d_model)
        self.layers = nn.ModuleList(EncoderLayer(d_model, heads, ffn) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.ln(h))


class TinyBlock(nn.Module):
    """About ten cheap elementwise ops on a small tensor, plus a tiny matmul so that FP16
    autocast has something to cast: the point is the op count, not the FLOPs."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mix = nn.Linear(width, width)
        self.scale = nn.Parameter(torch.ones(width))
        self.shift = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mix(x)                          # linear (autocast: FP16)
        h = h * self.scale + self.shift          # mul, add
        gate = torch.sigmoid(h)                  # sigmoid
        h = torch.tanh(h) * gate                 # tanh, mul
        h = h + 0.1 * torch.exp(0.25 * h)        # mul, exp, mul, add (|0.25 h| <= 0.25)
        h = F.layer_norm(h, h.shape[-1:])        # layer_norm
        return x + 0.5 * h                       # mul, add


class OpHeavy(nn.Module):
    def __init__(self, blocks: int, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TinyBlock(width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class ScaledOutput(nn.Module):
    """``inner``'s output times ``factor``: gradients ``factor`` times smaller everywhere."""

    def __init__(self, inner: nn.Module, factor: float) -> None:
        super().__init__()
        self.inner = inner
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.factor


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)


def _encoder(
    *, seed: int, layers: int, d_model: int, heads: int, ffn: int, batch: int, tokens: int,
    features: int = 64, classes: int = 16,
) -> Built:
    _seeded(seed)
    model = Encoder(
        features=features, d_model=d_model, heads=heads, ffn=ffn, layers=layers, classes=classes
    )
    model.train()
    x = torch.randn(batch, tokens, features)
    return model, x


def build_transformer(quick: bool = False) -> Built:
    """~31.6M parameters (10 layers of d_model 512, 8 heads, FFN 2048), batch 4 x 128."""
    if quick:
        return _encoder(seed=1, layers=2, d_model=256, heads=4, ffn=1024, batch=2, tokens=64)
    return _encoder(seed=1, layers=10, d_model=512, heads=8, ffn=2048, batch=4, tokens=128)


def build_transformer_nh402(quick: bool = False) -> Built:
    """``transformer`` with its output scaled by 1e-2: its gradients underflow FP16 at the
    default loss scale (NH402), so a scan runs a second backward for the loss-scale window,
    at the scale a cast boundary needs."""
    model, x = build_transformer(quick)
    return ScaledOutput(model, 1e-2), x


def build_ophavy(quick: bool = False) -> Built:
    """200 tiny blocks (~11 ops each) on a 64 x 64 tensor: ~2,200 forward ops."""
    _seeded(2)
    blocks = 20 if quick else 200
    model = OpHeavy(blocks, 64)
    model.train()
    return model, torch.randn(64, 64)


def _depth(layers: int, quick: bool) -> Built:
    if quick:
        return _encoder(seed=3, layers=max(1, layers // 4), d_model=64, heads=4, ffn=256,
                        batch=2, tokens=32)
    return _encoder(seed=3, layers=layers, d_model=256, heads=4, ffn=1024, batch=4, tokens=128)


def build_depth4(quick: bool = False) -> Built:
    return _depth(4, quick)


def build_depth8(quick: bool = False) -> Built:
    return _depth(8, quick)


def build_depth16(quick: bool = False) -> Built:
    return _depth(16, quick)


def build_depth32(quick: bool = False) -> Built:
    return _depth(32, quick)


class OwnLoss(nn.Module):
    """A transformers causal LM with its own loss: ``forward(input_ids)`` returns the model's
    language-modelling loss on its own input (``labels=input_ids``, shifted inside the model),
    so the default loss of the scan and of ``forward_backward`` (the mean of the floating
    outputs) is that loss, nothing added."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, labels=input_ids).loss


def _causal_lm(config: object, seed: int, vocab: int, batch: int, tokens: int) -> Built:
    """A transformers causal LM built from ``config`` with random weights (no download)."""
    from transformers import AutoModelForCausalLM

    _seeded(seed)
    lm = AutoModelForCausalLM.from_config(config)
    model = OwnLoss(lm)
    model.train()
    return model, torch.randint(0, vocab, (batch, tokens))


def build_gpt2_medium(quick: bool = False) -> Built:
    """GPT-2 medium's shape, random weights: 24 layers of n_embd 1024, 16 heads, vocabulary
    50257 (355M parameters), 2 x 128 tokens, its own LM loss. ``quick``: 2 layers of 64,
    vocabulary 1000, 2 x 16 tokens."""
    from transformers import GPT2Config

    if quick:
        config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=64)
        return _causal_lm(config, 4, 1000, 2, 16)
    config = GPT2Config(n_embd=1024, n_layer=24, n_head=16, vocab_size=50257, n_positions=1024)
    return _causal_lm(config, 4, 50257, 2, 128)


def build_llama_200m(quick: bool = False) -> Built:
    """A Llama shape of 210M parameters, random weights: 12 layers of hidden 1024, 16 heads,
    MLP 2560, vocabulary 32000, untied head, 2 x 128 tokens, its own LM loss. ``quick``: 2
    layers of 64, vocabulary 1000, 2 x 16 tokens."""
    from transformers import LlamaConfig

    if quick:
        config = LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
                             max_position_embeddings=64)
        return _causal_lm(config, 5, 1000, 2, 16)
    config = LlamaConfig(hidden_size=1024, intermediate_size=2560, num_hidden_layers=12,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                         max_position_embeddings=512)
    return _causal_lm(config, 5, 32000, 2, 128)


BUILDERS: dict[str, Callable[[bool], Built]] = {
    "transformer": build_transformer,
    "transformer-nh402": build_transformer_nh402,
    "ophavy": build_ophavy,
    "depth4": build_depth4,
    "depth8": build_depth8,
    "depth16": build_depth16,
    "depth32": build_depth32,
    "gpt2-medium": build_gpt2_medium,
    "llama-200m": build_llama_200m,
}

DEPTHS: dict[str, int] = {"depth4": 4, "depth8": 8, "depth16": 16, "depth32": 32}
"""Layers of each depth model at full size (``--quick`` builds a quarter of that)."""


def quick_layers(name: str) -> int:
    """Layers of a depth model under ``--quick``."""
    return max(1, DEPTHS[name] // 4)


def model_file(name: str) -> tuple[Callable[[], torch.nn.Module], Callable[[], torch.Tensor]]:
    """``build_model`` and ``sample_batch`` of a model file for ``BUILDERS[name]`` at full size:
    the batch is the one built with the model (built on first use by either)."""
    built: dict[str, torch.Tensor] = {}

    def build_model() -> torch.nn.Module:
        model, batch = BUILDERS[name](False)
        built["batch"] = batch
        return model

    def sample_batch() -> torch.Tensor:
        if "batch" not in built:
            build_model()
        return built["batch"]

    return build_model, sample_batch
