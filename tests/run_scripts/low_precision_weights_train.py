"""Training with the weights themselves in low precision (no FP32 master copy), for ``nan-hunter
run``'s lost-updates check: ``w - lr * g`` with ``lr * g`` ~1e-5 rounds back to ``w`` (|w| ~0.1,
half a unit in its last place ~2e-4 in BF16, ~3e-5 in FP16). ``--master`` trains the same model
the right way: FP32 parameters under autocast.

    python tests/run_scripts/low_precision_weights_train.py --dtype bfloat16 [--master]
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--master", action="store_true")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    if not args.master:
        model = model.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for _ in range(args.steps):
        with torch.autocast("cpu", dtype=dtype, enabled=args.master):
            out = model(x if args.master else x.to(dtype))
        loss = (out.float() - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("done")


if __name__ == "__main__":
    main()
