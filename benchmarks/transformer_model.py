"""The benchmark transformer of ``models.py`` as a model file, for whole-process measurements:
``nan-hunter scan benchmarks/transformer_model.py`` against a plain FP32 step of the same file
(``isolation_cost.py --model benchmarks/transformer_model.py``)."""

from __future__ import annotations

from models import model_file

build_model, sample_batch = model_file("transformer")
