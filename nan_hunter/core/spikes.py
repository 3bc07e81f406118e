"""Loss spikes: a step's loss more than ``factor`` times the median of the recent ones.

The rule of Megatron-LM's and Lightning's spike detection, on the losses ``run`` already
reads: once ``warmup`` finite losses were seen, a finite loss above ``factor`` times the
median of the last ``window`` ones (that median above 0) is a spike. Every finite loss enters
the window, a spike too, so a lasting change of level becomes the new median after half a
window. A loss at or below 0, or a median at or below 0, is never judged (a ratio to it says
nothing).

    rule = SpikeRule(factor=10.0, window=50, warmup=10)
    watch = SpikeWatch(rule)
    spike = watch.observe(step, loss)    # None, or the Spike with its one-line description

``run`` reads the step's loss (the sum of its losses, divided by a GradScaler's scale) in the
one host sync its step check makes anyway (``training.attach``). Torch-free: the command line
builds the rule.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from nan_hunter.errors import NanHunterError


@dataclass(frozen=True)
class SpikeRule:
    """When a loss is a spike: above ``factor`` x the median of the last ``window`` losses,
    judged once ``warmup`` losses were seen."""

    factor: float = 10.0
    window: int = 50
    warmup: int = 10

    def __post_init__(self) -> None:
        if not self.factor > 1 or not math.isfinite(self.factor):
            raise NanHunterError(f"--spike-factor must be a number above 1, got {self.factor:g}")
        if self.window < 1 or self.warmup < 1:
            raise NanHunterError("--spike-window and --spike-warmup must be at least 1")


@dataclass(frozen=True)
class Spike:
    step: int
    loss: float
    median: float

    @property
    def ratio(self) -> float:
        return self.loss / self.median

    def line(self) -> str:
        return (f"the loss {self.loss:.3g} is {self.ratio:.3g}x its running median "
                f"{self.median:.3g}")


class SpikeWatch:
    """The recent losses and the spikes seen (see the module docstring)."""

    def __init__(self, rule: SpikeRule) -> None:
        self.rule = rule
        self.recent: deque[float] = deque(maxlen=rule.window)
        self.seen = 0
        """Finite losses observed."""
        self.count = 0
        """Spikes seen."""
        self.first: Spike | None = None

    def observe(self, step: int, loss: float) -> Spike | None:
        """Judge ``loss`` (the step's, read from ``value``) and add it to the window."""
        if not math.isfinite(loss):
            return None
        spike = None
        if self.seen >= self.rule.warmup and loss > 0:
            median = statistics.median(self.recent)
            if median > 0 and loss > self.rule.factor * median:
                spike = Spike(step, loss, median)
                self.count += 1
                self.first = self.first or spike
        self.recent.append(loss)
        self.seen += 1
        return spike
