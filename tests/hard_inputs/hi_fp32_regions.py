"""Hard input: FP32 computations the user already protected from autocast; nothing to report.

``Region`` computes ``x @ w.T`` (~1e5, beyond FP16's 65504) inside
``torch.autocast(device_type="cuda", enabled=False)`` with ``.float()`` operands and brings it
back in range (``log1p``) before leaving the region. ``Fp32Projection`` does the same inside a
``torch.autograd.Function`` whose forward is ``@torch.amp.custom_fwd(device_type="cuda",
cast_inputs=torch.float32)``. ``Unprotected`` is the same model without either protection: the
control, which must overflow.
"""

import torch
from torch import nn


class Fp32Projection(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        big = x @ w.t()  # FP32: autocast is off in a custom_fwd with cast_inputs
        ctx.save_for_backward(big, w, x)
        return torch.log1p(big.abs())

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        big, w, x = ctx.saved_tensors
        g = grad * torch.sign(big) / (1.0 + big.abs())
        return g @ w, g.t() @ x


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w_region = nn.Parameter(torch.full((4, 8), 100.0))
        self.w_function = nn.Parameter(torch.full((4, 8), 100.0))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type="cuda", enabled=False):
            big = x.float() @ self.w_region.float().t()
            region = torch.log1p(big.abs())
        function = Fp32Projection.apply(x, self.w_function)
        return self.head(torch.cat([region, function], dim=-1))


class Unprotected(Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = x @ self.w_region.t()  # <- unprotected culprit
        region = torch.log1p(big.abs())
        return self.head(torch.cat([region, region], dim=-1))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Model()


def sample_batch() -> torch.Tensor:
    torch.manual_seed(0)
    return 150.0 + torch.rand(4, 8)
