"""A GAN training script for ``nan-hunter run`` tests, unaware of nan-hunter.

A generator and a discriminator, each with its own Adam, share one GradScaler (FP16 autocast
on the CPU): per iteration ``scaler.step(opt_d)``, ``scaler.step(opt_g)``, one
``scaler.update()``. At iterations 10, 11 and 12 one network's loss is multiplied by 1e30, so
its FP16 gradients overflow and GradScaler skips that optimizer's step, while the other
optimizer updates: the discriminator at 10 and 12, the generator at 11. No optimizer is
skipped twice in a row. At ``--nan-at K`` (default 30) the real batch holds a NaN: the
discriminator's loss is NaN. Two optimizer steps per iteration: iteration K's discriminator
step is optimizer step 2K - 1.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--nan-at", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    discriminator = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-4)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1000)
    bce = nn.BCEWithLogitsLoss()
    for it in range(1, args.iterations + 1):
        real = torch.randn(32, 4)
        if it == args.nan_at:
            real[0, 0] = float("nan")
        z = torch.randn(32, 8)
        boost_d = 1e30 if it in (10, 12) else 1.0
        boost_g = 1e30 if it == 11 else 1.0
        with torch.autocast("cpu", dtype=torch.float16):
            fake = generator(z)
            d_real = discriminator(real).float()
            d_fake = discriminator(fake.detach()).float()
            loss_d = (bce(d_real, torch.ones_like(d_real))
                      + bce(d_fake, torch.zeros_like(d_fake))) * boost_d
        opt_d.zero_grad()
        scaler.scale(loss_d).backward()
        scaler.step(opt_d)
        with torch.autocast("cpu", dtype=torch.float16):
            d_gen = discriminator(fake).float()
            loss_g = bce(d_gen, torch.ones_like(d_gen)) * boost_g
        opt_g.zero_grad()
        scaler.scale(loss_g).backward()
        scaler.step(opt_g)
        scaler.update()
    print("done")


if __name__ == "__main__":
    main()
