"""A PyTorch Lightning script, unaware of nan-hunter: the pair encoder of ``pairs_train.py``
trained with automatic optimization (``optimizer.step(closure)``), its ``training_step`` under
FP16 autocast on the CPU, without a GradScaler. The raw dot-product scores grow with Adam's
large steps until the matmul overflows FP16 at step 7."""

import sys

import torch
from torch import nn

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl


class PairScorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(32, 64)
        self.key = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.query(x) @ self.key(x).transpose(-2, -1)  # culprit


class LitPairs(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.pairs = PairScorer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pairs(x)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            scores = self(batch[0]).float()
        return 1e-5 * scores.pow(2).mean() - scores.diagonal().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.5)


def main() -> None:
    torch.manual_seed(0)
    model = LitPairs()
    torch.manual_seed(1)
    data = torch.randn(1, 16, 32).repeat(20, 1, 1)
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=20, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=sys.argv[1],
    )
    trainer.fit(model, loader)
    print("trained", trainer.global_step)


if __name__ == "__main__":
    main()
