"""Cheap per-tensor statistics, taken from tensors (the data and its one-line summary are in
``trace.summary``).

Statistics are taken over finite values only; NaN and inf are counted separately. Everything is
computed with a handful of reductions and no copy of the tensor beyond one boolean mask.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

import torch

from nan_hunter.precision.formats import FP16, FloatFormat
from nan_hunter.trace import torch_originals as real
from nan_hunter.trace.summary import FLOAT_DTYPES, TensorStats, format_number

__all__ = [
    "EXACT_UP_TO", "SAMPLE", "TensorStats", "dense_view", "dtype_name", "finite_flag",
    "flat_values", "format_number", "sample_of", "sample_size", "sample_step", "scaled",
    "tensor_stats",
]  # fmt: skip

_DTYPE_NAMES = {getattr(torch, name): name for name in FLOAT_DTYPES}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


EXACT_UP_TO = 131072
"""``tiny`` (and the gradient histograms) are counted over every value of a tensor up to this
many values; beyond, on an evenly strided sample of about ``SAMPLE`` values (``sample_of``): a
share is all they feed. ``zeros`` are counted exactly wherever a finding reads them (see
``StatsQueue``'s ``exact_zeros``): a flush to 0 or a divisor's 0 can sit in one column that a
strided sample never visits."""
SAMPLE = 16384
"""The size of the sample beyond ``EXACT_UP_TO`` values: a share estimated on it is within
+-0.8% of the tensor's (two standard deviations, at any share), and counting on it costs a
fraction of a pass over a large tensor (a 65,536-value sample of a strided tensor cost 4x its
extremes)."""


def sample_step(n: int) -> int:
    """The stride of the sample of ``n`` values: 1 (every value) up to ``EXACT_UP_TO``."""
    return 1 if n <= EXACT_UP_TO else n // SAMPLE


def sample_size(n: int) -> int:
    """How many of ``n`` values the sample of ``sample_of`` (and of the gradient histograms)
    takes: all of them up to ``EXACT_UP_TO``."""
    return len(range(0, n, sample_step(n)))


def sample_of(flat: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The evenly strided sample of a flat tensor that ``tiny`` is counted on, and the factor
    that scales a count over it to the whole tensor (1.0: all values)."""
    n = flat.numel()
    step = sample_step(n)
    if step == 1:
        return flat, 1.0
    sample = flat[::step]
    return sample, n / sample.numel()


def flat_values(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a flat tensor, in memory order and without a copy when its elements fill
    their span of storage once each (``dense_view``); else flattened by ``reshape``, a copy."""
    view = dense_view(t)
    return view.view(-1) if view is not None else t.reshape(-1)


def dense_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` itself when contiguous, else a flat view of its values in memory order when its
    elements fill their span of storage once each (a transposed or permuted result, the heads of
    an attention split); None otherwise (a slice with gaps, an expanded tensor). Reductions do
    not depend on the order, and run several times faster on the flat view than on a transposed
    tensor (``aminmax`` of a transposed 512 x 512: 164 against 37 us); ``reshape`` would copy
    it. Two tensors with the same shape and strides (a value and its rounded copy) come out in
    the same order."""
    if t.is_contiguous():
        return t
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    if span == t.numel() and all(s > 0 for s in t.stride()) and _no_overlap(t):
        return t.as_strided((t.numel(),), (1,), t.storage_offset())
    return None


def _no_overlap(t: torch.Tensor) -> bool:
    """Whether no two of ``t``'s elements share a place: with the dimensions sorted by stride,
    each stride is at least the extent of the dimensions below it."""
    extent = 1
    for stride, size in sorted(zip(t.stride(), t.shape, strict=True)):
        if size == 1:
            continue
        if stride < extent:
            return False
        extent = stride * size
    return True


def scaled(count: int, factor: float) -> int:
    """A count over ``sample_of``'s sample, as an estimate for the whole tensor."""
    return count if factor == 1.0 else round(count * factor)


def tensor_stats(t: torch.Tensor, fmt: FloatFormat = FP16, *, counts: bool = True) -> TensorStats:
    """Summarise ``t``; floating tensors get full statistics, others shape and dtype only.

    One ``aminmax`` pass settles range and finiteness (NaN and inf show in the extremes); the
    NaN/inf counts are only taken when they are there. ``counts`` adds ``zeros`` and ``tiny``
    (values below ``fmt``'s smallest normal, the ones that format loses).
    """
    if t.layout != torch.strided:
        return _sparse_stats(t, fmt, counts=counts)
    shape = tuple(int(s) for s in t.shape)
    numel = t.numel()
    name = dtype_name(t.dtype)
    if numel == 0 or not t.is_floating_point():
        return TensorStats(shape=shape, dtype=name, numel=numel)
    data = t.detach()
    if data.element_size() == 1:  # float8: no isfinite/aminmax kernels; FP32 holds it exactly
        data = data.float()
    lo, hi = real.aminmax(data)
    lo_f, hi_f = float(lo), float(hi)
    nan = posinf = neginf = 0
    finite_vals = data
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
        finite_mask = real.isfinite(data)
        n_finite = int(finite_mask.sum())
        nan = int(real.isnan(data).sum())
        posinf = int(real.isposinf(data).sum())
        neginf = numel - n_finite - nan - posinf
        if n_finite == 0:
            return TensorStats(shape, name, numel, nan, posinf, neginf)
        finite_vals = data[finite_mask]
        lo, hi = real.aminmax(finite_vals)
        lo_f, hi_f = float(lo), float(hi)
    zeros = tiny = None
    if counts:
        flat = finite_vals.reshape(-1)
        zeros = flat.numel() - int(torch.count_nonzero(flat))
        sample, factor = sample_of(flat)
        magnitude = sample.abs()
        tiny_mask = (magnitude < fmt.smallest_normal) & (magnitude > 0)
        tiny = scaled(int(torch.count_nonzero(tiny_mask)), factor)
    return TensorStats(
        shape=shape,
        dtype=name,
        numel=numel,
        nan=nan,
        posinf=posinf,
        neginf=neginf,
        min=lo_f,
        max=hi_f,
        abs_max=max(abs(lo_f), abs(hi_f)),
        zeros=zeros,
        tiny=tiny,
    )


def stored_values(t: torch.Tensor) -> torch.Tensor:
    """The values a sparse tensor stores, flat and detached (COO coalesced first)."""
    data = t.detach()
    return (data.coalesce() if data.layout == torch.sparse_coo else data).values().reshape(-1)


def _sparse_stats(t: torch.Tensor, fmt: FloatFormat, *, counts: bool) -> TensorStats:
    """A sparse tensor (the gradient of ``Embedding(sparse=True)``): the statistics of its stored
    values, with the values it does not store counted as the zeros they are, over its full
    shape (a dense copy could take gigabytes)."""
    stored = stored_values(t)
    of_stored = tensor_stats(stored, fmt, counts=counts)
    implicit = t.numel() - stored.numel()
    shape = tuple(int(s) for s in t.shape)
    if not t.is_floating_point() or implicit == 0:
        return replace(of_stored, shape=shape, numel=t.numel())
    low = 0.0 if of_stored.min is None else min(of_stored.min, 0.0)
    high = 0.0 if of_stored.max is None else max(of_stored.max, 0.0)
    return replace(
        of_stored,
        shape=shape,
        numel=t.numel(),
        min=low,
        max=high,
        abs_max=max(abs(low), abs(high)),
        zeros=None if of_stored.zeros is None else of_stored.zeros + implicit,
    )


def finite_flag(tensors: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """A 0-dim bool tensor: every element of ``tensors`` is finite. No host sync; None when
    there is nothing to check.

    On a GPU: one fused max-abs reduction per device (``_foreach_norm`` with ``ord=inf``: NaN
    and inf propagate, and unlike a 2-norm it cannot overflow on finite FP16). On a CPU, where
    that reduction is slow, one sum per tensor, accumulated in at least FP32: NaN and inf
    propagate too; only a sum beyond FP32's range (about 3.4e38, far past any gradient an
    optimizer can use) would also read as non-finite."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if hasattr(t, "to_local"):  # a DTensor (FSDP2): this rank's shard; ranks then agree
            t = t.to_local()
        if t.is_sparse:
            t = t.coalesce().values()
        if t.numel() and (t.is_floating_point() or t.is_complex()):
            by_device.setdefault(t.device, []).append(t)
    if not by_device:
        return None
    with torch.no_grad():
        flags = [_group_finite(group) for group in by_device.values()]
        if len(flags) == 1:
            return flags[0]
        first = flags[0].device
        return torch.stack([f.to(first) for f in flags]).all()


_LOW = (torch.float16, torch.bfloat16)


def _group_finite(group: list[torch.Tensor]) -> torch.Tensor:
    if group[0].device.type == "cpu":
        sums = [t.sum(dtype=torch.float32) if t.dtype in _LOW else t.sum() for t in group]
        return real.isfinite(torch.stack(sums)).all()
    return real.isfinite(torch.stack(torch._foreach_norm(group, math.inf))).all()
