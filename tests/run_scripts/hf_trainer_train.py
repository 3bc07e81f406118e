"""A Hugging Face Trainer script, unaware of nan-hunter: a tiny regression model that computes
its own loss, as HF models do, trained for 8 steps on the CPU; the batch of step 4 holds a value
of 1e25, whose square overflows FP32 in the model's loss (rows in a fixed order: an iterable
dataset is not shuffled)."""

import sys
from collections.abc import Iterator

import torch
from torch import nn
from transformers import Trainer, TrainingArguments

BAD_STEP = 4  # 1-based, as the Trainer counts


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        out = self.head(torch.relu(self.encoder(x))).squeeze(-1)
        result = {"logits": out}
        if labels is not None:
            result["loss"] = (out - labels).pow(2).mean()  # culprit
        return result


class Rows(torch.utils.data.IterableDataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(8, 8, generator=g)
        self.x[BAD_STEP - 1, 0] = 1e25
        self.y = torch.rand(8, generator=g)

    def __len__(self) -> int:
        return 8

    def __iter__(self) -> Iterator[dict]:
        return iter({"x": x, "labels": y} for x, y in zip(self.x, self.y, strict=True))


def main() -> None:
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=sys.argv[1], per_device_train_batch_size=1, max_steps=8, use_cpu=True,
        report_to=[], logging_steps=100, save_strategy="no", learning_rate=1e-3,
        dataloader_drop_last=False, disable_tqdm=True,
    )
    trainer = Trainer(model=Regressor(), args=args, train_dataset=Rows())
    trainer.train()
    print("trained", trainer.state.global_step)


if __name__ == "__main__":
    main()
