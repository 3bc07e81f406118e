"""A LightningModule around ``tests.training_models.Tiny`` (imported only where Lightning is)."""

from __future__ import annotations

from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl  # type: ignore[no-redef]

from tests.training_models import Tiny


class LitTiny(Tiny, pl.LightningModule):
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self(batch["x"], labels=batch["labels"])["loss"]
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-3)
