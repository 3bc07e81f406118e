"""GPT-2 medium's shape (355M parameters, random weights, its own LM loss, 2 x 128 tokens) as a
model file, for whole-process measurements: ``nan-hunter scan benchmarks/gpt2_medium_model.py``
against a plain FP32 step of the same file
(``isolation_cost.py --model benchmarks/gpt2_medium_model.py``). Needs transformers."""

from __future__ import annotations

import torch
from models import BUILDERS

_built: dict[str, torch.Tensor] = {}


def build_model() -> torch.nn.Module:
    model, batch = BUILDERS["gpt2-medium"](False)
    _built["batch"] = batch
    return model


def sample_batch() -> torch.Tensor:
    if "batch" not in _built:
        build_model()
    return _built["batch"]
