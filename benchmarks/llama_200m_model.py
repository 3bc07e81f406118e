"""A Llama shape (210M parameters, random weights, its own LM loss, 2 x 128 tokens) as a
model file, for whole-process measurements: ``nan-hunter scan benchmarks/llama_200m_model.py``
against a plain FP32 step of the same file
(``isolation_cost.py --model benchmarks/llama_200m_model.py``). Needs transformers."""

from __future__ import annotations

from models import model_file

build_model, sample_batch = model_file("llama-200m")
