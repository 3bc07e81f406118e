"""A training script for ``nan-hunter run`` tests, unaware of nan-hunter: a linear regression
whose loss is finite throughout but jumps at step ``--spike-at`` (default 20), whose batch is
scaled by 30 (its gradients clipped, so the next steps are as before); ``--steps N`` (default
30), ``--scaler`` (a GradScaler, FP16 autocast on CPU)."""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--spike-at", type=int, default=20)
    parser.add_argument("--scaler", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    target = torch.randn(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=args.scaler)
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 8)
        if step == args.spike_at:
            x = x * 30
        with torch.autocast("cpu", dtype=torch.float16, enabled=args.scaler):
            loss = (model(x).float() - x @ target).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the spike barely moves it
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    print("done")


if __name__ == "__main__":
    main()
