"""A training run whose activations grow steadily until FP16 overflows (the forecast's test).

A learnable gain scales the hidden layer; a regulariser with the wrong sign (``- c * gain**2``,
as a logit scale or a temperature that training keeps pushing up) makes SGD multiply it by
``1 + 2 * lr * c`` at every step: the hidden activations double every ~12 steps, and the
Linear after them overflows FP16 at step 158. CPU autocast in float16, as a user's script
on a GPU would run CUDA autocast.

    python tests/run_scripts/growing_gain_train.py --steps 400
"""

import argparse

import torch
from torch import nn


class GainMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.gain = nn.Parameter(torch.tensor(1.0))
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x)) * self.gain
        return self.out(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--growth", type=float, default=0.06)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GainMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(8, 16) * 4.0
    y = torch.randn(8, 4)
    for step in range(args.steps):
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = (out.float() - y).pow(2).mean() * 1e-9 - args.growth * model.gain.pow(2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not torch.isfinite(out).all():
            print(f"non-finite output at step {step + 1}")
            break
    print("done")


if __name__ == "__main__":
    main()
