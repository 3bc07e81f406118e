"""Framework callbacks around ``nan_hunter.watch``: ``integrations.transformers`` (the Hugging
Face ``Trainer``) and ``integrations.lightning`` (PyTorch Lightning). Each module imports its
framework only when used; accelerate's wrapped model/optimizer/scaler go straight to ``watch``."""
