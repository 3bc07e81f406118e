"""A training script for ``nan-hunter run`` tests, unaware of nan-hunter: a ridge solve.

The model of ``tests/fixtures/fx_inverse_boundary.py``, trained under FP16 autocast on the CPU
with a GradScaler. Its dictionary has two almost identical atoms, so ``inverse(D^T D + lam I)``
reaches ~7e5 in FP32 and the matmul after it, cast to FP16 by autocast, gives NaN at the first
step. An FP32 region around the inverse and the matmul alone is refuted by its re-scan (the
gradient flowing back into the FP16 ``dtd`` overflows); the region that takes in ``dtd = d.t()
@ d`` too is verified.
"""

import argparse

import torch
from torch import nn

N_SIGNAL = 64
N_ATOMS = 32


class Ridge(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        d = torch.randn(N_SIGNAL, N_ATOMS) * 0.1
        d[:, 1] = d[:, 0] + 2e-4 * torch.randn(N_SIGNAL)
        self.dictionary = nn.Parameter(d)
        self.lam = 1e-6
        self.head = nn.Linear(N_ATOMS, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.dictionary
        dtd = d.t() @ d  # producer
        z = (d.t() @ x.t()).float()
        eye = torch.eye(N_ATOMS, device=x.device)
        dtd_inv = torch.inverse(dtd + self.lam * eye)
        codes = torch.matmul(dtd_inv, z)  # culprit
        return self.head(codes.t())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Ridge()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(args.steps):
        x = torch.randn(4, N_SIGNAL)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    print("done")


if __name__ == "__main__":
    main()
