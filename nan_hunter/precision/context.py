"""The precision a pass runs under: autocast for the scan, plain FP32 for the reference."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from nan_hunter.precision.formats import FloatFormat


def autocast_context(device: str, fmt: FloatFormat) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` on ``device`` with the scan's low-precision dtype (native policy)."""
    return torch.autocast(device_type=device, dtype=fmt.dtype)


def fp32_context(device: str) -> contextlib.AbstractContextManager[Any]:
    """The FP32 reference: autocast explicitly off, so no ambient autocast leaks in."""
    return torch.autocast(device_type=device, enabled=False)
