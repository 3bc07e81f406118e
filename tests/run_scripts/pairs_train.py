"""A training script for ``nan-hunter run`` tests, unaware of nan-hunter.

A pair encoder scores every (query, key) pair by a raw dot product; Adam at a large learning
rate grows the weights, and with them the scores, until the ``q @ k^T`` matmul passes 65504 at
step 12 under FP16 autocast (CPU). Flags change the loop: ``--steps N``, ``--no-scaler``,
``--fp32`` (no autocast), ``--nan-at K`` (a NaN in the batch of step K), ``--fail-at K`` (the
forward raises at step K), ``--exit CODE`` (``sys.exit(CODE)`` at the end), ``--kwargs`` (the
model called with keyword arguments), ``--catch`` (the loop catches ``Exception`` and prints it),
``--clip`` (clips before ``scaler.unscale_``, with ``clip_grad_norm_`` imported by name),
``--backward function|imported`` (the backward started by ``torch.autograd.backward([loss])``,
or by ``backward(loss)`` imported from ``torch.autograd``, instead of ``loss.backward()``).
"""

import argparse
import sys

import torch
from torch import nn
from torch.autograd import backward
from torch.nn.utils import clip_grad_norm_


class PairScorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(32, 64)
        self.key = nn.Linear(32, 64)
        self.calls = 0
        self.fail_at = -1

    def forward(self, x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError("the scorer failed on purpose")
        q = self.query(x)
        k = self.key(x)
        scores = q @ k.transpose(-2, -1)  # culprit
        return scores / temperature


class PairModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pairs = PairScorer()

    def forward(self, x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        return self.pairs(x, temperature=temperature)


def train(model: nn.Module, args: argparse.Namespace) -> None:
    torch.manual_seed(1)
    batch = torch.randn(16, 32)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", enabled=not args.no_scaler and not args.fp32)
    for step in range(1, args.steps + 1):
        x = batch.clone()
        if step == args.nan_at:
            x[0, 0] = float("nan")
        with torch.autocast("cpu", dtype=torch.float16, enabled=not args.fp32):
            scores = model(x=x, temperature=1.0) if args.kwargs else model(x)
            scores = scores.float()
            loss = 1e-5 * scores.pow(2).mean() - scores.diagonal().mean()
        if args.backward == "function":
            torch.autograd.backward([scaler.scale(loss)])
        elif args.backward == "imported":
            backward(scaler.scale(loss))
        else:
            scaler.scale(loss).backward()
        if args.clip:
            clip_grad_norm_(model.parameters(), 1.0)  # clips scaled gradients
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-scaler", action="store_true")
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--nan-at", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--exit", type=int, default=0)
    parser.add_argument("--kwargs", action="store_true")
    parser.add_argument("--catch", action="store_true")
    parser.add_argument("--clip", action="store_true")
    parser.add_argument("--backward", choices=("method", "function", "imported"), default="method")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = PairModel()
    model.pairs.fail_at = args.fail_at
    try:
        train(model, args)
    except Exception as exc:
        if not args.catch:
            raise
        print(f"caught {type(exc).__name__}")
    finally:  # what a script saving its checkpoint here would save
        finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        print(f"weights finite: {finite}")
    print("done", sys.argv[1:])
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
