"""Sparse-coding encoder whose ridge-regression solve overflows FP16.

The encoder turns signals ``x`` into codes by solving the ridge system
``(D^T D + lam * I) codes = z`` with ``z = D^T x``. The learned dictionary ``D`` (64 x 32) has two
almost identical atoms, so ``D^T D`` is nearly singular and its regularised inverse has
entries up to ~3e5: perfectly fine in FP32, far above FP16's largest finite value (65504).

The Gram matrix and ``z`` are built in FP32 on purpose (autocast is switched off around
them) and ``torch.inverse`` itself runs in FP32 (CPU autocast policy). The codes themselves
are moderate (below 1e4). The problem is the very next line: under autocast
``torch.matmul`` casts its inputs to FP16, ``dtd_inv`` becomes +-inf and the codes (and
everything after them) become inf/NaN. On CUDA ``torch.inverse`` on an FP16 tensor would
even raise; here the FP32 value is fine and only the cast at the matmul breaks it.

Fix: keep the solve in FP32 (run the matmul under ``torch.autocast(..., enabled=False)``
with ``.float()`` operands, or use ``torch.linalg.solve`` in FP32) and cast the codes after.

Batch: ``x``, a (4, 64) FP32 tensor of signals (finite, standard normal).
"""

import torch
from torch import nn

N_SIGNAL = 64
N_ATOMS = 32
N_SAMPLES = 4


class SparseCodingEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        d = torch.randn(N_SIGNAL, N_ATOMS) * 0.1
        # Two nearly identical atoms: D^T D is close to singular.
        d[:, 1] = d[:, 0] + 2e-4 * torch.randn(N_SIGNAL)
        self.dictionary = nn.Parameter(d)
        self.lam = 1e-6
        self.head = nn.Linear(N_ATOMS, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            d = self.dictionary.float()
            dtd = d.t() @ d
            z = d.t() @ x.float().t()
        eye = torch.eye(N_ATOMS, device=x.device, dtype=dtd.dtype)
        dtd_inv = torch.inverse(dtd + self.lam * eye)
        codes = torch.matmul(dtd_inv, z)
        return self.head(codes.t())


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return SparseCodingEncoder()


def sample_batch() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(N_SAMPLES, N_SIGNAL)
