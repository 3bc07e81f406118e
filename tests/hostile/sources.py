"""Model sources several hostile tests write into their projects."""

GRAM_LAYERS = """\
import torch
from torch import nn


class Gram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        h = self.proj(x) * 300.0
        g = h @ h.transpose(-2, -1)
        return g.mean(-1) / (g.abs().amax() + 1.0)
"""
"""A sibling module ``layers.py`` whose Gram matrix overflows FP16 (NH102), with a verified fix."""
