"""A WGAN-style loop for ``nan-hunter run``'s spike rule: five critic steps per generator step,
each network with its own optimizer. The critic's losses are ~0.01, the generator's ~1: one
running median of both would be the critic's, and every generator step a "spike". At
``--spike-at K`` (default: none) the generator's loss is multiplied by 1e4 once: a real spike.

    python tests/run_scripts/critic_train.py --iterations 20
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--spike-at", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    critic = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt_g = torch.optim.SGD(generator.parameters(), lr=1e-4)
    opt_c = torch.optim.SGD(critic.parameters(), lr=1e-4)
    for it in range(1, args.iterations + 1):
        for _ in range(5):
            real, z = torch.randn(16, 4), torch.randn(16, 8)
            loss_c = 0.01 + 1e-3 * (critic(generator(z).detach()).mean()
                                    - critic(real).mean()).abs()
            opt_c.zero_grad()
            loss_c.backward()
            opt_c.step()
        z = torch.randn(16, 8)
        loss_g = 1.0 + 0.1 * critic(generator(z)).mean().abs()
        if it == args.spike_at:
            loss_g = loss_g * 1e4
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
    print("done")


if __name__ == "__main__":
    main()
