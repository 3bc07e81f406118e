"""A training loop that breaks FP16 only after a few steps, caught by ``nan_hunter.watch``.

A pair encoder scores every (query, key) pair of a batch by the raw dot product of two linear
projections, ``scores = q @ k^T``, and is trained to make the matching pairs (the diagonal) score
high. The embeddings are never normalised and there is no temperature, so the objective is
unbounded: with Adam at a large learning rate every step makes the weights, and with them the
scores, larger. A squared-score penalty was meant to keep them bounded, but it is far too weak.

At the start the scores are about 12; each step they grow, and after about a dozen steps the
largest one passes 65504. In FP32 that is harmless, but under autocast the ``q @ k^T`` matmul
runs in FP16: the score becomes inf, the penalty's square and the loss NaN, and so do the
gradients. The GradScaler skips a few steps on the way (normal loss-scale back-off, not reported);
the NaN step is: step 11 of this loop (step 6 without a GradScaler, whose skipped steps leave the
weights as they were). ``nan-hunter scan`` on the initial weights is clean: the problem only exists
after training, which is what ``watch`` (or ``nan-hunter scan --steps N``) is for.

    python examples/training_loop_watch.py

Fix: normalise the embeddings (``F.normalize``) and divide the scores by a temperature, or
compute the scores in FP32.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from nan_hunter.training import OnProblem, Watcher, watch

D_IN = 32
D_EMBED = 64
BATCH = 16
LR = 0.5
STEPS = 20
PENALTY = 1e-5


class PairEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(D_IN, D_EMBED)
        self.key = nn.Linear(D_IN, D_EMBED)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.query(x)
        k = self.key(x)
        scores = q @ k.transpose(-2, -1)  # raw dot products: grow with the weights
        return scores


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return PairEncoder()


def sample_batch() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(BATCH, D_IN)


def loss_fn(scores: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    scores = scores.float()
    return PENALTY * scores.pow(2).mean() - scores.diagonal().mean()


def train(
    steps: int = STEPS, *, scaler: bool = True, on_problem: OnProblem = "stop", **options: object
) -> tuple[nn.Module, Watcher]:
    """Train a fresh model on the sample batch under CPU FP16 autocast, watched. Returns the
    model and the watcher (its ``reports`` hold the step that broke)."""
    model = build_model()
    batch = sample_batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    grad_scaler = torch.amp.GradScaler("cpu", enabled=scaler)
    with watch(
        model, optimizer, grad_scaler, loss_fn=loss_fn, on_problem=on_problem, device="cpu",
        **options,
    ) as w:
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(model(batch), batch)
            grad_scaler.scale(loss).backward()
            grad_scaler.step(optimizer)
            grad_scaler.update()
            w.step(batch, loss)
            optimizer.zero_grad()
            if w.stopped:
                break
    return model, w


def main() -> int:
    from nan_hunter.report import render

    _, w = train()
    print(f"{w.steps} steps run, {w.skipped} skipped by GradScaler, {w.problems} problem(s)")
    for event in w.reports:
        scale = f", loss scale {event.scale:g}" if event.scale is not None else ""
        state = "weights at the start of the step" if event.pre_step else "weights after the step"
        print(f"step {event.step}: {event.detail} (re-run on the {state}{scale})")
        if event.report is not None:
            print(render(event.report, "text"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
