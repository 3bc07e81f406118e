"""Training a sparse-coding encoder whose ridge solve overflows FP16 only after some epochs.

The encoder turns signals ``x`` into codes by solving the ridge system
``(D^T D + lam * I) codes = D^T x`` over a fixed dictionary ``D`` (64 x 32) that holds two
almost identical atoms, and reconstructs ``x`` from the codes (a learned gain per input channel
is what the optimizer trains). The ridge strength ``lam`` is annealed, as continuation methods
do: it starts at 1e-3 and shrinks 2.5x per epoch, and the largest entry of
``(D^T D + lam * I)^-1`` grows as ``1 / lam``: 500 in epoch 1, past 65504 (FP16's largest finite
value) in epoch 7.

The Gram matrix and ``torch.inverse`` run in FP32 on purpose; the ``torch.matmul`` right after
them runs in FP16 under autocast, which casts the inverse to FP16: its largest entries become
inf, and the codes, the reconstruction and the loss NaN. In FP32 nothing is wrong. The loop is
a plain one (autocast, GradScaler, Adam) and knows nothing of nan-hunter:

    python examples/train_sparse_coding.py                  # trains; the loss turns NaN
    nan-hunter run examples/train_sparse_coding.py          # stops at that step, with a patch

``nan-hunter scan examples/train_sparse_coding.py`` on the initial weights is clean: the problem
only exists after training. Fix: keep the solve and the matmul in FP32 (the patch ``run``
writes), or solve with ``torch.linalg.solve`` in FP32.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

N_SIGNAL = 64
N_ATOMS = 32
BATCH = 16
BATCHES_PER_EPOCH = 8
EPOCHS = 10
LR = 1e-2
LAM_START = 1e-3
LAM_DECAY = 0.4


class SparseCodingEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        d = torch.randn(N_SIGNAL, N_ATOMS) * 0.1
        d[:, 1] = d[:, 0] + 2e-4 * torch.randn(N_SIGNAL)  # two nearly identical atoms
        self.register_buffer("dictionary", d)
        self.gain = nn.Parameter(torch.ones(N_SIGNAL))
        self.lam = LAM_START

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            d = self.dictionary.float()
            dtd = d.t() @ d
            z = d.t() @ (x.float() * self.gain).t()
        eye = torch.eye(N_ATOMS, device=x.device, dtype=dtd.dtype)
        dtd_inv = torch.inverse(dtd + self.lam * eye)
        codes = torch.matmul(dtd_inv, z)
        return (d @ codes.float()).t()


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return SparseCodingEncoder()


def signals(generator: torch.Generator, dictionary: torch.Tensor) -> torch.Tensor:
    """Signals made of a few atoms each, plus noise."""
    codes = torch.randn(N_ATOMS, BATCH, generator=generator)
    codes *= torch.rand(N_ATOMS, BATCH, generator=generator) < 0.2
    noise = 0.01 * torch.randn(N_SIGNAL, BATCH, generator=generator)
    return (dictionary @ codes + noise).t()


def sample_batch() -> torch.Tensor:
    return signals(torch.Generator().manual_seed(1), build_model().dictionary)


def main() -> int:
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu")
    data = torch.Generator().manual_seed(1)
    for epoch in range(1, EPOCHS + 1):
        model.lam = LAM_START * LAM_DECAY ** (epoch - 1)
        total = 0.0
        for _ in range(BATCHES_PER_EPOCH):
            x = signals(data, model.dictionary)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = (model(x) - x).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            total += loss.item()
        print(f"epoch {epoch}: loss {total / BATCHES_PER_EPOCH:.3g}, lam {model.lam:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
