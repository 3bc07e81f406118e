"""Tensor statistics without a host read per tensor: queued, computed and read back in batches.

Each traced tensor is reduced when it is queued (its extremes, and zero and tiny-value counts,
as 0-d tensors on its device: kernels are queued, nothing is read); ``flush`` reads all of them
back with one ``tolist()``: one host synchronisation per batch instead of several per tensor.
Only a tensor whose extremes show NaN or inf gets the detailed, non-finite statistics (counts,
finite range), from the tensor itself, held (within a byte budget) until the flush.

The tracer flushes before every in-place op it sees, and the version counter (shared by views) of
a held tensor is checked at the flush. A non-finite tensor that is not held, or was written to out
of sight, raises ``StaleStatistics``; the runner then repeats the pass with a queue of depth 0
(every tensor summarised when it is queued, as it was).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from nan_hunter.errors import PassSignal
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.trace import torch_originals as real
from nan_hunter.trace.stats import (
    TensorStats,
    dense_view,
    dtype_name,
    sample_of,
    sample_size,
    sample_step,
    scaled,
    tensor_stats,
)

V = TypeVar("V")

MAX_PENDING = 512
"""Tensors held at most before a flush."""
MAX_HELD_BYTES = 2 << 20
"""Bytes of queued tensors kept alive for their detailed statistics, should they hold NaN or
inf: what the queue may keep alive beyond a plain run."""


def version_of(t: torch.Tensor) -> int:
    """``t._version``; -1 for an inference tensor, which has no version counter (it can only be
    written to inside ``inference_mode``, where nothing can tell)."""
    return -1 if t.is_inference() else t._version


class StaleStatistics(PassSignal):
    """A queued tensor was written to, out of the tracer's sight, before its statistics were
    taken."""


class TensorMap(Generic[V]):
    """Values keyed by tensor identity that do not keep the tensors alive.

    Cheaper than ``torch.utils.weak.WeakIdKeyDictionary`` (no Python-level reference class and no
    removal callbacks): an entry whose tensor died stays until the map is dropped, and a new
    tensor that reuses its ``id`` does not see it (the weak reference must still point to it).
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[torch.Tensor], V]] = {}

    def get(self, key: torch.Tensor, default: V | None = None) -> V | None:
        entry = self._entries.get(id(key))
        if entry is not None and entry[0]() is key:
            return entry[1]
        return default

    def __getitem__(self, key: torch.Tensor) -> V:
        entry = self._entries.get(id(key))
        if entry is None or entry[0]() is not key:
            raise KeyError(key)
        return entry[1]

    def __setitem__(self, key: torch.Tensor, value: V) -> None:
        self._entries[id(key)] = (weakref.ref(key), value)

    def __contains__(self, key: object) -> bool:
        entry = self._entries.get(id(key))
        return entry is not None and entry[0]() is key

    def pop(self, key: torch.Tensor, default: V | None = None) -> V | None:
        entry = self._entries.get(id(key))
        if entry is None or entry[0]() is not key:
            return default
        del self._entries[id(key)]
        return entry[1]


class ResultBuffer:
    """Preallocated device buffers (one per dtype) that reductions write their 0-d results
    into (``out=``), read back together and reused.

    Thousands of small result tensors living until the read-back would sit between the
    activations on the heap and keep freed memory from being reused (RSS grows by the size of
    the activations); written into a few buffers allocated up front, they take no heap of
    their own.
    """

    def __init__(self, size: int) -> None:
        self._size = min(max(size, 1), 1 << 14)  # grows when needed
        self._buffers: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self._views: dict[tuple[torch.dtype, int], list[torch.Tensor]] = {}
        """Each buffer's 0-d views, made once (a view per call would cost more than the op)."""
        self._used: dict[tuple[torch.dtype, int], int] = {}

    def take(self, t: torch.Tensor, n: int, dtype: torch.dtype | None = None) -> tuple[
        tuple[torch.dtype, int], int, list[torch.Tensor]
    ]:
        """``n`` consecutive places of ``dtype`` (default ``t``'s) on ``t``'s device: their
        key, first index, and the buffer's 0-d views (to pass as ``out=``)."""
        key = (dtype or t.dtype, t.get_device())
        views = self._views.get(key)
        used = self._used.get(key, 0)
        if views is None or used + n > len(views):
            buffer = self._buffers.get(key)
            with torch.inference_mode(False):  # written to inside and outside such regions
                grown = torch.empty(max(self._size, 2 * used + n), dtype=key[0], device=t.device)
            if buffer is not None:
                grown[:used].copy_(buffer[:used])
            self._buffers[key] = grown
            self._views[key] = views = list(grown.unbind())
        self._used[key] = used + n
        return key, used, views

    def read(self) -> dict[Any, list[float]]:
        """Every buffer's used places, read back in one go (FP64 holds them exactly); then the
        buffers are free for reuse."""
        used = [(key, n) for key, n in self._used.items() if n]
        self._used = {}
        if not used:
            return {}
        parts = [self._buffers[key][:n].to(torch.float64) for key, n in used]
        flat = torch.cat(parts).tolist() if len(parts) > 1 else parts[0].tolist()
        found, at = {}, 0
        for key, n in used:
            found[key] = flat[at : at + n]
            at += n
        return found


class StatsQueue:
    """Slots of ``TensorStats``, filled in batches; ``stats(slot)`` is final after ``flush``.

    ``add`` runs the reductions at once (kernels queued on the tensor's device, nothing read
    back), so later writes to the tensor do not matter. The tensor itself is held, within
    ``max_held`` bytes, only for the case that its extremes turn out non-finite: the detailed
    statistics are then taken from it at the flush (``StaleStatistics`` if it is not held or was
    written to since).
    """

    def __init__(
        self,
        fmt: FloatFormat,
        *,
        depth: int = MAX_PENDING,
        max_held: int = MAX_HELD_BYTES,
        on_flush: Callable[[], None] | None = None,
        exact_zeros: bool = True,
    ) -> None:
        self._fmt = fmt
        self._exact_zeros = exact_zeros
        """Count the zeros of every 16-bit tensor exactly; without, those of tensors beyond
        ``EXACT_UP_TO`` values are estimated on the sample the tiny values are counted on (an
        exact count costs two to three times the extremes; see ``estimated_zeros``)."""
        self.estimated_zeros = False
        """Whether some tensor's zero count is an estimate."""
        self._depth = depth
        self._max_held = max_held
        self._on_flush = on_flush
        """Called after each flush (the tracer resolves what waited for statistics)."""
        self._results: list[TensorStats | None] = []
        self._pending: list[_Pending] = []
        self._buffer = ResultBuffer(2 * depth)
        self._held = 0
        self.flushes = 0
        """Host reads so far (for tests and benchmarks)."""

    @property
    def pending(self) -> int:
        return len(self._pending)

    def detach(self) -> None:
        """Forget the flush callback (it refers back to the tracer) and the tensors held."""
        self._on_flush = None
        self._pending, self._held = [], 0

    @property
    def depth(self) -> int:
        return self._depth

    def add(self, t: torch.Tensor, counts: bool) -> int:
        """Queue ``t``'s statistics (``counts``: zeros and tiny values too); returns its slot."""
        slot = len(self._results)
        numel = t.numel()
        if numel == 0 or not t.is_floating_point() or t.is_meta:
            # a meta tensor has no values (torch's own Python builds some, for shapes)
            self._results.append(TensorStats(tuple(t.shape), dtype_name(t.dtype), numel))
            return slot
        if t.layout != torch.strided:  # a sparse gradient: rare, summarised at once
            with torch._C._DisableTorchDispatch(), torch._C._DisableAutocast():
                self._results.append(tensor_stats(t, self._fmt, counts=counts))
            return slot
        self._results.append(None)
        with torch._C._DisableTorchDispatch(), torch._C._DisableAutocast():
            places = self._reduce(t, counts)
        size = numel * t.element_size()
        held = None
        if self._depth == 1 or self._held + size <= self._max_held:  # depth 1: read at once
            held = t
            self._held += size
        self._pending.append((slot, t.shape, t.dtype, numel, counts, held, version_of(t), places))
        if len(self._pending) >= self._depth:
            self.flush()
        return slot

    def unwritten(self, t: torch.Tensor) -> int:
        """A slot for memory no op wrote (an allocation's result): no statistic is taken."""
        self._results.append(
            TensorStats(tuple(t.shape), dtype_name(t.dtype), t.numel(), zeros=None, tiny=None,
                        unwritten=True)
        )
        return len(self._results) - 1

    def stats(self, slot: int) -> TensorStats:
        result = self._results[slot]
        if result is None:
            self.flush()
            result = self._results[slot]
            assert result is not None
        return result

    def ready(self, slot: int) -> TensorStats | None:
        return self._results[slot]

    def flush(self) -> None:
        pending, self._pending, self._held = self._pending, [], 0
        if not pending:
            return
        # Our own reductions: no dispatch mode (the FP16 emulation) and no autocast applies.
        with torch._C._DisableTorchDispatch(), torch._C._DisableAutocast():
            self._summarise(pending, self._buffer.read())
        self.flushes += 1
        if self._on_flush is not None:
            self._on_flush()

    def _reduce(self, t: torch.Tensor, counts: bool) -> tuple[Any, int, Any]:
        """Writes ``t``'s extremes (and nonzero and tiny counts) into the result buffer;
        returns where: (key, index of min and max, (key, index of the three counts: the
        nonzero values (unless estimated), the sample's nonzero values (16-bit only, when
        sampled), the sample's tiny values or, 16-bit, those with an exponent; whether 16-bit;
        whether the zeros are estimated) or None)."""
        data = t.detach()
        if data.element_size() == 1:  # float8: no aminmax kernel; FP32 holds it exactly
            data = data.float()
        key, at, views = self._buffer.take(data, 2)
        dense = dense_view(data)  # a transposed result: several times faster read flat
        real.aminmax(data if dense is None else dense, out=(views[at], views[at + 1]))
        if not counts:
            return key, at, None
        flat = data.reshape(-1) if dense is None else dense.view(-1)  # a copy if not dense
        count_key, count_at, counts_ = self._buffer.take(data, 3, torch.int64)
        shift = _HALF_MANTISSA_BITS.get(data.dtype) if data.dtype == self._fmt.dtype else None
        if shift is not None:
            # A 16-bit float's magnitude bits: 0 for +-0; a zero exponent field for a
            # subnormal. Integer kernels count them 2.5x faster than float ones: the nonzero
            # values (all of them), the sample's nonzero ones and those with an exponent
            # (normal, inf or NaN); the sample's tiny ones are the difference.
            estimated = sample_step(flat.numel()) > 1 and not self._exact_zeros
            if estimated:  # only the sample's bits: its nonzero values stand for all of them
                sample = _magnitude_bits(sample_of(flat)[0])
                self.estimated_zeros = True
            else:
                bits = _magnitude_bits(flat)
                counts_[count_at].copy_(torch.count_nonzero(bits))
                sample, _ = sample_of(bits)
            if sample.numel() != flat.numel():
                counts_[count_at + 1].copy_(torch.count_nonzero(sample))
            exponent = sample.bitwise_right_shift(shift)
            counts_[count_at + 2].copy_(torch.count_nonzero(exponent))
            return key, at, (count_key, count_at, True, estimated)
        sample, _ = sample_of(flat)
        counts_[count_at].copy_(torch.count_nonzero(flat))
        magnitude = sample.abs()
        tiny = (magnitude < self._fmt.smallest_normal) & (magnitude > 0)
        counts_[count_at + 2].copy_(torch.count_nonzero(tiny))
        return key, at, (count_key, count_at, False, False)

    def _summarise(self, pending: list[_Pending], host: dict[Any, list[float]]) -> None:
        fmt = self._fmt
        for slot, shape, dtype, numel, counts, held, version, (key, at, where) in pending:
            lo_f, hi_f = host[key][at], host[key][at + 1]
            zeros = tiny = None
            if where is not None:
                values, first = host[where[0]], where[1]
                tiny_count = int(values[first + 2])
                sampled = sample_size(numel)
                factor = numel / sampled
                # estimated zeros (where[3]): from the sample's nonzero values
                nonzero = (
                    scaled(int(values[first + 1]), factor) if where[3] else int(values[first])
                )
                if where[2]:  # 16-bit: the sample's nonzero values minus those with an exponent
                    sample_nonzero = int(values[first + 1]) if sampled < numel else nonzero
                    tiny_count = sample_nonzero - tiny_count
                zeros, tiny = numel - nonzero, scaled(tiny_count, factor)
            if not (_finite(lo_f) and _finite(hi_f)):
                # NaN or inf: the detailed statistics, from the tensor itself (unchanged).
                if held is None or version_of(held) != version:
                    raise StaleStatistics("a non-finite tensor is no longer at hand as it was")
                self._results[slot] = tensor_stats(held.detach(), fmt, counts=counts)
                continue
            self._results[slot] = TensorStats(
                shape=tuple(shape),
                dtype=dtype_name(dtype),
                numel=numel,
                min=lo_f,
                max=hi_f,
                abs_max=max(abs(lo_f), abs(hi_f)),
                zeros=zeros,
                tiny=tiny,
            )


_Pending = tuple[
    int, torch.Size, torch.dtype, int, bool, "torch.Tensor | None", int, tuple[Any, int, Any]
]
"""slot, shape, dtype, numel, counts, the tensor if held, its version then, where its results
are in the buffer."""


_HALF_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}
"""The mantissa width of the 16-bit float formats: their magnitude bits shifted right by it
leave the exponent field, 0 for zeros and subnormals."""


def _magnitude_bits(t: torch.Tensor) -> torch.Tensor:
    """A 16-bit float tensor's bits without the sign, as int16."""
    return t.view(torch.int16).bitwise_and(0x7FFF)


def _finite(x: float) -> bool:
    return x - x == 0.0
