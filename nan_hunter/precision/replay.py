"""Every FP32 re-run in one place: an op replayed with its inputs in FP32 (the tracer carrying
on after an op CUDA's autocast policy refuses; the analysis's verdict on an origin op), and the
context of the whole FP32 reference pass."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from nan_hunter.errors import OURS_AS_THEY_ARE, InternalError
from nan_hunter.trace import torch_originals as real

AUTOCAST_DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
"""The devices whose autocast state a replay turns off."""


def replay_in_fp32(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    float64_too: bool = False,
) -> Any:
    """``func(*args, **kwargs)`` again with its floating-point tensors in FP32 and autocast
    off on every device. FP64 tensors stay FP64 unless ``float64_too``. A failure of the
    casts is ours (``InternalError``); one of ``func`` is passed on as it is."""

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and (
            float64_too or x.dtype != torch.float64
        ):
            return x.float()
        return x

    try:
        up_args, up_kwargs = tree_map(up, args), tree_map(up, kwargs)
    except OURS_AS_THEY_ARE:
        raise
    except Exception as exc:
        raise InternalError(exc) from exc
    with contextlib.ExitStack() as stack:
        for device in AUTOCAST_DEVICES:
            stack.enter_context(real.autocast(device_type=device, enabled=False))
        return func(*up_args, **up_kwargs)


def fp32_context(device: str) -> contextlib.AbstractContextManager[object]:
    """The FP32 reference pass: autocast explicitly off, so no ambient autocast leaks in."""
    return real.autocast(device_type=device, enabled=False)
