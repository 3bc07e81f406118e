"""The real precision bugs of ``tests/test_real_precision.py``, each on real code.

- ``autocast_rotary``: the rotary embedding of transformers' Llama as 4.38 shipped it,
  ``inv_freq @ position_ids`` with autocast left on: a CUDA autocast casts both operands of the
  matmul to BF16, positions past 256 included (fixed by running it under
  ``torch.autocast(..., enabled=False)``; transformers now multiplies in FP32 elementwise).
- ``cached_rotary``: GPT-NeoX's (and Falcon's) rotary cache as transformers <= 4.35 built it,
  ``torch.arange(seq_len, dtype=self.inv_freq.dtype)``: ``inv_freq`` is a buffer, so after
  ``model.to(torch.bfloat16)`` the positions are BF16 (fixed with ``dtype=torch.int64`` and
  ``.float()``).
- ``NaiveLayerNorm``: a LayerNorm whose variance is ``E[x^2] - E[x]^2``, as hand-written
  normalisations have it, on activations with an offset (a large mean): the two terms are
  nearly equal and BF16 keeps their rounding error.
- ``CausalLinearAttention``: causal linear attention (Katharopoulos et al., "Transformers are
  RNNs", 2020) as ``causal_linear_attn`` of lucidrains' linear-attention-transformer writes it:
  two ``cumsum`` over the sequence, in BF16 once the model is (``model.to(torch.bfloat16)``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# --- transformers' rotary embeddings, their pre-fix forwards


def autocast_rotary_forward(
    self: Any, x: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``LlamaRotaryEmbedding.forward`` of transformers 4.38 (before the autocast fix)."""
    inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)  # <- rotary matmul
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * self.attention_scaling
    sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def cached_rotary_forward(
    self: Any, x: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-NeoX's ``RotaryEmbedding._set_cos_sin_cache`` of transformers <= 4.35, called from
    its forward for the sequence length, and the cache indexed by the positions."""
    seq_len = position_ids.shape[-1]
    t = torch.arange(seq_len, device=x.device, dtype=self.inv_freq.dtype)  # <- cache positions
    freqs = torch.einsum("i,j->ij", t, self.inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[position_ids], emb.sin()[position_ids]
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def with_rotary_forward(model: nn.Module, forward: Any) -> nn.Module:
    """``model`` with each rotary embedding module's forward replaced by ``forward`` (a
    subclass, so the module keeps its buffers and the scan sees a module call)."""
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            old = type(module)
            module.__class__ = type(f"PreFix{old.__name__}", (old,), {"forward": forward})
    return model


# --- a hand-written LayerNorm


class NaiveLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm``'s parameters, the variance as ``E[x^2] - E[x]^2``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean  # <- variance
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def with_naive_layer_norms(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if type(module) is nn.LayerNorm:
            module.__class__ = NaiveLayerNorm
    return model


# --- causal linear attention


def causal_linear_attn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """lucidrains/linear-attention-transformer's ``causal_linear_attn`` (no bucketing)."""
    q = q.softmax(dim=-1)
    k = torch.exp(k).type(v.dtype)
    k_cumsum = k.cumsum(dim=-2)  # <- key cumsum
    d_inv = 1.0 / torch.einsum("bhnd,bhnd->bhn", q, k_cumsum.type_as(q) + eps)
    context = torch.einsum("bhnd,bhne->bhnde", k, v)
    context = context.cumsum(dim=-3)  # <- context cumsum
    return torch.einsum("bhnde,bhnd,bhn->bhne", context, q, d_inv)


class CausalLinearAttention(nn.Module):
    """One causal linear-attention layer: projections, ``causal_linear_attn``, output."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = causal_linear_attn(q, k, v)
        return self.out(attn.transpose(1, 2).reshape(b, n, d)) + x


def causal_linear_attention_model(dim: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(CausalLinearAttention(dim), nn.LayerNorm(dim), nn.Linear(dim, 1))


def layer_norm_offset(model: nn.Module, offset: float) -> nn.Module:
    """BERT's word embeddings shifted by ``offset``: the first LayerNorm's input has a mean
    of ``offset`` (large activations, as trained models have them)."""
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(offset)
    return model
