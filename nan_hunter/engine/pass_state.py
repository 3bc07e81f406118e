"""The process state a pass sets up and a pass that runs again rewinds: the cyclic garbage
collector's threshold, the random number generators (every compared pass starts from one
seed), and the precision contexts a pass enters anew."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

import torch

GC_THRESHOLD = 100_000
"""Allocations between two young-generation collections during a scan (Python's default: 700).
A pass creates a few Python objects per op that all live to the scan's end, and so do the
analysis's; with the default, the collector walks them again and again (a fifth of an op-heavy
scan's time). Cycles are still collected, a hundred times less often."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the cyclic garbage collector's first threshold for the duration of a scan or a
    pass (nested: the outermost restores it)."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


RngState = tuple[torch.Tensor, list[torch.Tensor] | None]
"""The CPU generator's state, and each CUDA device's (None: CUDA not initialised)."""


def rng_state() -> RngState:
    """The random number generators' state now (to run a pass again from it)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.random.get_rng_state(), cuda


def set_rng_state(state: RngState) -> None:
    """Rewind the random number generators to ``state`` (the same dropout masks again)."""
    torch.random.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


COMPARED_PASS_SEED = 0
"""The seed every pass whose loss is compared starts from (``compared_pass_start``)."""


_start: RngState | None = None
"""Where compared passes start instead of the seed (``compared_passes_from``)."""


def compared_pass_start() -> None:
    """Seed the random number generators (CPU and every CUDA device) for a pass whose loss is
    compared with another's: the low-precision pass, the FP32 reference, the FP32 loss of a
    patched model, and each pass of a verification re-scan. They then draw the same dropout
    masks, so a correct fix is not refuted because the reference drew other ones ("the loss
    changed"). The scan keeps the caller's random state around all of it
    (``engine._random_state_kept``). Inside ``compared_passes_from(state)`` they start from
    ``state`` instead."""
    if _start is not None:
        set_rng_state(_start)
        return
    torch.manual_seed(COMPARED_PASS_SEED)


@contextlib.contextmanager
def compared_passes_from(state: RngState) -> Iterator[None]:
    """Compared passes start from ``state`` inside the block, not from the seed: the re-run
    of a training step draws the dropout masks the step drew (``nan-hunter run``)."""
    global _start
    before, _start = _start, state
    try:
        yield
    finally:
        _start = before


def first_then_anew(
    context: contextlib.AbstractContextManager[Any] | None,
) -> Callable[[], contextlib.AbstractContextManager[Any] | None]:
    """``context`` on the first call, then a new one like it on each later call (a pass that
    runs again): ``@contextmanager`` ones are single-use (and forget their function once
    entered, so it is taken now)."""
    func = getattr(context, "func", None)
    unused = [context]
    if isinstance(context, contextlib._GeneratorContextManager) and func is not None:
        args, kwds, kind = context.args, context.kwds, type(context)
        return lambda: unused.pop() if unused else kind(func, args, kwds)
    return lambda: context
