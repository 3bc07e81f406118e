"""Self-attention without the 1/sqrt(d) scaling: the attention scores overflow FP16.

A single-head attention block computes ``scores = q @ k^T`` but forgets to divide by
``sqrt(d_model)``. On top of that the query/key projections were initialised with
``nn.init.normal_`` (std 1 instead of ~1/sqrt(d)) and the input embeddings are unnormalised
(std ~10), so q and k have entries of a few hundred and their dot products over 64 features
reach ~1e5. In FP32 that is harmless: softmax just saturates to (almost) one-hot rows.

Under autocast the ``q @ k^T`` matmul runs in FP16, whose largest finite value is 65504,
so many scores become +-inf. ``softmax`` then computes ``inf - inf`` = NaN for every row that
contains +inf, and the NaN spreads through ``attn @ v`` to the output.

Fix: scale the scores (``q @ k^T / sqrt(d)``, or scale q before the matmul), normalise the
input, or use ``torch.nn.functional.scaled_dot_product_attention``.

Batch: ``x``, a (2, 16, 64) FP32 tensor.
"""

import torch
from torch import nn

D_MODEL = 64
SEQ = 16
BATCH = 2


class UnscaledSelfAttention(nn.Module):
    def __init__(self, d_model: int = D_MODEL) -> None:
        super().__init__()
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # The mistake that makes q and k large: std 1 instead of about 1/sqrt(d_model).
        nn.init.normal_(self.q_proj.weight)
        nn.init.normal_(self.k_proj.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        scores = q @ k.transpose(-2, -1)  # missing: / math.sqrt(d_model)
        attn = scores.softmax(-1)
        out = attn @ v
        return self.out_proj(out)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return UnscaledSelfAttention()


def sample_batch() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(BATCH, SEQ, D_MODEL) * 10.0
