"""One rank of the Lightning DDP test (``tests/test_distributed.py`` runs it with torchrun):
``strategy="ddp"`` on the CPU (gloo), ``NanHunterCallback``, rank 1's batch at step ``BAD_STEP``
explodes. Each rank writes what it saw to ``OUT/lightning_rank{r}.json``."""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

import torch

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl  # type: ignore[no-redef]

from nan_hunter.integrations.lightning import NanHunterCallback
from tests.lightning_models import LitTiny
from tests.training_models import dataset

BAD_STEP = 2
BAD_RANK = 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    callback = NanHunterCallback(preflight=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=6, max_epochs=1,
        callbacks=[callback], default_root_dir=str(args.out), logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    data = dataset(bad_step=BAD_STEP if rank == BAD_RANK else None)
    trainer.fit(LitTiny(), torch.utils.data.DataLoader(data, batch_size=1))
    seen = {
        "rank": rank,
        "global_step": trainer.global_step,
        "events": [
            {
                "step": e.step,
                "rank": e.rank,
                "world_size": e.world_size,
                "origin_rank": e.origin_rank,
                "reason": e.reason.value,
                "first": [e.report.findings[0].code, e.report.findings[0].module]
                if e.report and e.report.findings else None,
            }
            for e in callback.events
        ],
        "files": sorted(p.name for p in callback.report_files),
    }
    (args.out / f"lightning_rank{rank}.json").write_text(json.dumps(seen), encoding="utf-8")


if __name__ == "__main__":
    main()
