"""nan-hunter: find where and why FP16 mixed precision breaks a PyTorch model, and fix it."""

__version__ = "0.1.0"
