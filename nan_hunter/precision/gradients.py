"""What FP16 does to gradients: values lost to underflow, and the loss scales that would save them.

During the emulated backward every FP16 result is computed in FP32 first and then rounded, so
the FP32 value each gradient *should* have is at hand at the moment it is rounded. ``GradientLog``
records, per rounded gradient, how many nonzero values vanished (became 0) or went subnormal, and,
over all gradients, a histogram of their binary exponents. Backpropagation is linear in the loss,
so a loss scale of ``2**k`` shifts every exponent by ``k``: the histogram tells for which scales no
gradient overflows and little underflows, the window a ``GradScaler`` should start in.

The histograms themselves (counted on the device, one row per gradient): ``exponents``; which
autograd node's gradient reaches a parameter's, and so gets a histogram: ``grad_nodes``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from nan_hunter.errors import PassSignal
from nan_hunter.precision.exponents import (
    BIASED,
    EXP_OFFSET,
    ROW,
    exponent_counts,
    exponent_histogram,
    fill_row,
    lost_share,
)
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.grad_nodes import current_node, feeds_parameter
from nan_hunter.precision.scale_window import ScaleWindow, scale_advice
from nan_hunter.trace import deferred
from nan_hunter.trace import torch_originals as real
from nan_hunter.trace.deferred import StaleStatistics, TensorMap, version_of
from nan_hunter.trace.stats import dense_view, sample_size, sample_step, stored_values

__all__ = [
    "Boundary", "FlushStats", "GradRecord", "GradientLog", "ScaleWindow", "scale_advice",
]

@dataclass(frozen=True)
class FlushStats:
    nonzero: int
    """Nonzero values of the gradient as computed in FP32."""
    vanished: int
    """... that became 0 in FP16."""
    subnormal: int
    """... that became subnormal in FP16 (below 6.1e-5: a few bits of precision left)."""

    @property
    def lost_share(self) -> float:
        return (self.vanished + self.subnormal) / self.nonzero if self.nonzero else 0.0

    def __add__(self, other: FlushStats) -> FlushStats:
        return FlushStats(
            self.nonzero + other.nonzero,
            self.vanished + other.vanished,
            self.subnormal + other.subnormal,
        )


@dataclass(frozen=True)
class GradRecord:
    """What rounding to FP16 did to one gradient tensor."""

    flush: FlushStats
    histogram: tuple[int, ...]
    """Counts of the nonzero FP32 values per binary exponent (index - 160)."""


@dataclass(frozen=True)
class Boundary:
    """A gradient cast from FP32 down to FP16 on its way back (the backward of an FP32 op,
    such as a loss autocast runs in FP32, fed by an FP16 value): what the cast lost."""

    shape: tuple[int, ...]
    record: GradRecord


class UnmeasuredGradient(PassSignal):
    """A parameter's gradient was rounded where no parameter was in sight, without its
    histogram: the pass must run again with every gradient of a parameter's size measured."""


class GradientLog:
    """Filled by the FP16 emulation while a backward runs.

    ``record`` queues each gradient's reductions on its device without reading anything back;
    ``flush`` (at the latest when ``records`` or ``max_abs`` is read) reads them back in one go,
    so the backward makes no host read per gradient. Histograms of gradients held within a
    byte budget are counted together at the flush; beyond it, at once.
    """

    def __init__(self, fmt: FloatFormat, *, depth: int | None = None) -> None:
        self._fmt = fmt
        top = 2.0 ** (math.floor(math.log2(fmt.max)) + 1)  # the next power of two
        self._overflow = (fmt.max + top) / 2
        """Rounded to ``fmt``, a value this large or larger becomes inf (FP16: 65520; the tie
        rounds to even, the mantissa of 65504 is odd)."""
        self._depth = deferred.MAX_PENDING if depth is None else max(depth, 1)
        self._records: TensorMap[_Slot] = TensorMap()
        """Per rounded gradient (and its views and casts, sharing the slot): its record."""
        self._sizes: set[int] | None = None
        self._node: object = None
        self._node_feeds = False
        """The last node ``feeds_parameter`` was asked about, and its answer."""
        self._params: set[int] | None = None
        """``id``s of the watched parameters: a gradient gets its histogram only when the node
        that rounds it feeds one of them (through casts and views); None: every gradient."""
        self._max_abs = 0.0
        self.overflowed = False
        """Whether a gradient was not finite, or became inf when rounded (beyond the format's
        largest value), before or at its rounding."""
        self._pending: list[_PendingGrad] = []
        self._held = 0
        self._buffer = deferred.ResultBuffer(2 * self._depth)
        self._rows: torch.Tensor | None = None
        self._rows_used = 0
        self._row_views: list[torch.Tensor] = []
        self._boundaries: list[tuple[tuple[int, ...], _Slot]] = []
        """Gradients cast from FP32 to FP16, in backward order (the loss's input first)."""

    def reset(self, *, depth: int | None = None) -> None:
        """Forget everything (a pass that runs again, ``depth`` records per read-back; depth 1,
        the careful rerun, also gives every gradient of a parameter's size its histogram)."""
        if depth is not None:
            self._depth = max(depth, 1)
        self._records = TensorMap()
        self._max_abs = 0.0
        self.overflowed = False
        self._pending, self._held = [], 0
        self._boundaries = []
        self._node = None  # a failed backward's node holds its graph (never flushed)

    @property
    def max_abs(self) -> float:
        """The largest finite gradient magnitude seen, before rounding."""
        self.flush()
        return self._max_abs

    @property
    def records(self) -> _Resolved:
        """Per rounded gradient tensor (or a view or cast of one): its ``GradRecord``."""
        self.flush()
        return _Resolved(self)

    def watch(self, params: list[torch.Tensor], *, every: bool = False) -> None:
        """Only a gradient that can end up as one of ``params``' gradients gets a histogram
        (the rest only update the maximum): one with as many values as a parameter, rounded by
        an autograd node that feeds a parameter through casts, views and custom functions only
        (``feeds_parameter``), or, with ``every``, any with as many values as a parameter. A
        parameter's gradient rounded elsewhere (``w * 1.0`` hands its gradient on unchanged)
        has none: ``records_of`` then raises ``UnmeasuredGradient``, and the pass runs again
        with ``every``."""
        self._sizes = {p.numel() for p in params}
        self._params = None if every else {id(p) for p in params}
        self._node, self._node_feeds = None, False

    def _wants_histogram(self, rounded: torch.Tensor) -> bool:
        if self._sizes is None:
            return True
        if rounded.numel() not in self._sizes:
            return False
        if self._depth == 1 or self._params is None:
            return True
        node = current_node()
        if node is None:
            return True
        if node is not self._node:  # a node rounds several gradients (an addmm's three)
            self._node = node
            self._node_feeds = feeds_parameter(node, self._params, self._fmt.dtype)
        return self._node_feeds

    def record(self, exact: torch.Tensor, rounded: torch.Tensor, *, boundary: bool = False) -> None:
        """``exact``: an FP32 gradient before rounding; ``rounded``: the FP16 result.
        ``boundary``: a dtype cast (FP32 -> FP16) rather than an FP16 op's result: always
        measured, and kept in ``boundaries``."""
        slot = _Slot()
        self._records[rounded] = slot
        if boundary:
            self._boundaries.append((tuple(rounded.shape), slot))
        if exact.layout != torch.strided or rounded.layout != torch.strided:
            # A sparse gradient (``Embedding(sparse=True)`` in half mode): what rounding did to
            # the values it stores (those it does not store are zeros, exact and rounded).
            exact, rounded = stored_values(exact), stored_values(rounded)
        n = exact.numel()
        if n == 0:  # an empty gradient, or a sparse one storing none (padding ids only)
            return
        full = boundary or self._wants_histogram(rounded)
        size = n * (exact.element_size() + rounded.element_size())
        held = row = None
        with torch._C._DisableTorchDispatch(), torch._C._DisableAutocast():
            data = exact.detach()
            key, at, views = self._buffer.take(data, 2)
            dense = dense_view(data)  # a transposed gradient: several times faster read flat
            flat = data if dense is None else dense
            real.aminmax(flat, out=(views[at], views[at + 1]))  # NaN and inf show here
            if self._depth == 1 or self._held + size <= deferred.MAX_HELD_BYTES:  # NaN detail
                held = (exact, rounded, version_of(exact), version_of(rounded))
                self._held += size
            if full:
                rows, index, dest = self._next_row(data.device)
                fill_row(dest, data, rounded.detach())
                row = (rows, index)
        self._pending.append((slot, (key, at), n, held, row))
        if len(self._pending) >= self._depth:
            self.flush()

    def _next_row(self, device: torch.device) -> tuple[torch.Tensor, int, torch.Tensor]:
        """The next free row of the current row matrix (few long-lived allocations: thousands
        of small ones between the activations would fragment the heap): the matrix, the row's
        index and the row."""
        rows = self._rows
        if rows is None or self._rows_used == rows.shape[0] or rows.device != device:
            size = min(max(self._depth, 1), 1024)
            rows = torch.empty(size, ROW, dtype=torch.int64, device=device)
            self._rows, self._rows_used = rows, 0
            self._row_views = list(rows.unbind())
        index = self._rows_used
        self._rows_used += 1
        return rows, index, self._row_views[index]

    def flush(self) -> None:
        self._node = None  # not kept alive (and its graph) beyond the backward
        pending, self._pending, self._held = self._pending, [], 0
        if not pending:
            return
        with torch._C._DisableTorchDispatch(), torch._C._DisableAutocast():
            host = self._buffer.read()
        for slot, (key, at), n, held, row in pending:
            top = max(abs(host[key][at]), abs(host[key][at + 1]))
            if not math.isfinite(top):
                self.overflowed = True
                if held is None or (version_of(held[0]), version_of(held[1])) != held[2:]:
                    raise StaleStatistics("a non-finite gradient is no longer at hand")
                with torch._C._DisableTorchDispatch(), torch._C._DisableAutocast():
                    slot.value = self._record_now(held[0], held[1], full=row is not None)
                if row is None and self._sizes is not None and n in self._sizes:
                    slot.value = _SKIPPED
                continue
            self._max_abs = max(self._max_abs, top)
            if top >= self._overflow:
                self.overflowed = True
            if row is not None:
                # The histogram stays on the device until someone asks for this record.
                slot.value = _Row(row[0], row[1], n)
            elif self._sizes is not None and n in self._sizes:
                slot.value = _SKIPPED

    def records_of(self, tensors: list[torch.Tensor | None]) -> list[GradRecord | None]:
        """The records of ``tensors`` (the parameters' gradients), read back in one go."""
        self.flush()
        slots = [self._records.get(t) if t is not None else None for t in tensors]
        if any(s is not None and s.value is _SKIPPED for s in slots):
            raise UnmeasuredGradient("a parameter's gradient was rounded out of its sight")
        return self._resolve(slots)

    @property
    def boundaries(self) -> list[Boundary]:
        """Gradients cast from FP32 to FP16, in backward order (the loss's input first)."""
        self.flush()
        records = self._resolve([slot for _, slot in self._boundaries])
        return [
            Boundary(shape, record)
            for (shape, _), record in zip(self._boundaries, records, strict=True)
            if record is not None
        ]

    def _resolve(self, slots: list[_Slot | None]) -> list[GradRecord | None]:
        """The slots' records, those still on the device read back in one go."""
        waiting = [s for s in slots if s is not None and isinstance(s.value, _Row)]
        if waiting:
            with torch._C._DisableTorchDispatch():
                host = torch.stack([s.value.rows[s.value.row] for s in waiting]).tolist()
            for slot, values in zip(waiting, host, strict=True):
                if isinstance(slot.value, _Row):  # a slot may be listed twice
                    n = slot.value.numel
                    sampled = sample_size(n)
                    zeros, rounded_zeros = int(values[0]), sampled - int(values[BIASED + 1])
                    histogram = exponent_histogram(values[1 : BIASED + 1])
                    slot.value = self._finish(n, zeros, rounded_zeros, histogram)
        return [
            s.value if s is not None and isinstance(s.value, GradRecord) else None for s in slots
        ]

    def _finish(
        self, n: int, zeros: int, rounded_zeros: int, histogram: tuple[int, ...]
    ) -> GradRecord:
        """The record of a gradient of ``n`` values from its sample's counts: ``zeros`` and
        ``rounded_zeros`` of the exact and rounded values, ``histogram`` the exponents (zeros
        already taken out)."""
        sampled = sample_size(n)
        nonzero = sampled - zeros
        limit = EXP_OFFSET + round(math.log2(self._fmt.smallest_normal))
        below_normal = sum(histogram[: limit + 1])
        vanished = max(0, rounded_zeros - zeros)
        flush = FlushStats(nonzero, vanished, max(0, below_normal - vanished))
        if sampled < n:  # counts of the whole tensor, estimated
            scale = n / sampled
            flush = FlushStats(*(round(k * scale) for k in (nonzero, vanished, flush.subnormal)))
        return GradRecord(flush, histogram)

    def _record_now(
        self, exact: torch.Tensor, rounded: torch.Tensor, *, full: bool
    ) -> GradRecord | None:
        """The unbatched record of a gradient with NaN or inf (finite values only)."""
        exact = exact.detach()
        exact = exact[real.isfinite(exact)]
        if exact.numel() == 0:
            return None
        lo, hi = real.aminmax(exact)
        self._max_abs = max(self._max_abs, abs(float(lo)), abs(float(hi)))
        if not full:
            return None
        flat_exact = exact.reshape(-1)
        flat_rounded = rounded.detach().reshape(-1)
        step = sample_step(flat_exact.numel())
        if step > 1:
            flat_exact, flat_rounded = flat_exact[::step], flat_rounded[::step]
        zeros, histogram = exponent_counts(flat_exact)
        nonzero = flat_exact.numel() - zeros
        limit = EXP_OFFSET + round(math.log2(self._fmt.smallest_normal))
        below_normal = sum(histogram[: limit + 1])
        vanished = max(0, flat_rounded.numel() - int(torch.count_nonzero(flat_rounded)) - zeros)
        flush = FlushStats(nonzero, vanished, max(0, below_normal - vanished))
        if step > 1:  # counts of the whole tensor, estimated
            scale = exact.numel() / flat_exact.numel()
            flush = FlushStats(*(round(n * scale) for n in (nonzero, vanished, flush.subnormal)))
        return GradRecord(flush, histogram)

    def boundary_low(self, current_scale: float, max_underflow_share: float) -> int | None:
        """The smallest exponent ``k`` at which no cast boundary loses more than
        ``max_underflow_share`` of its values; None when none loses that much at the current
        scale."""
        shift = math.log2(current_scale)
        limit = math.log2(self._fmt.smallest_normal)
        cumulative = [
            list(itertools.accumulate(b.record.histogram))
            for b in self.boundaries
            if b.record.flush.nonzero
        ]
        if not any(lost_share(c, 0.0, limit) > max_underflow_share for c in cumulative):
            return None
        for k in range(-40, 81):
            if all(lost_share(c, k - shift, limit) <= max_underflow_share for c in cumulative):
                return k
        return None

    def inherit(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """``target`` is a view or copy of ``source`` (a transpose, the cast back to FP32)."""
        slot = self._records.get(source)
        if slot is not None:
            self._records[target] = slot

    def window(
        self,
        current_scale: float,
        max_underflow_share: float,
        parameters: list[GradRecord],
    ) -> ScaleWindow:
        """Scales ``2**k`` at which no gradient overflows and no parameter loses more than
        ``max_underflow_share`` of its nonzero gradient values to underflow."""
        if self.max_abs == 0.0:
            return ScaleWindow(None, None, current_scale, 0.0)
        shift = math.log2(current_scale)
        limit = math.log2(self._fmt.smallest_normal)
        true_max = self.max_abs / current_scale
        cumulative = [list(itertools.accumulate(r.histogram)) for r in parameters if r.histogram]
        counted = [c for c in cumulative if c[-1] != 0]  # the others lose nothing (share 0)
        ks = []
        for k in range(-40, 41):
            if true_max * 2.0**k > self._fmt.max:
                continue
            # all(lost_share(c, k - shift, limit) <= share for c in cumulative), the bin index
            # computed once per scale: shares are >= 0, so the largest one decides.
            last = math.floor(limit - (k - shift)) + EXP_OFFSET
            worst = 0.0
            if last >= 0:
                worst = max((c[min(last, len(c) - 1)] / c[-1] for c in counted), default=0.0)
            if not cumulative or worst <= max_underflow_share:
                ks.append(k)
        if not ks:
            return ScaleWindow(None, None, current_scale, self.max_abs)
        low = min(ks) if cumulative and min(ks) > -40 else None
        return ScaleWindow(low, max(ks), current_scale, self.max_abs)


_PendingGrad = tuple[
    "_Slot",
    "tuple[object, int]",
    int,
    "tuple[torch.Tensor, torch.Tensor, int, int] | None",
    "tuple[torch.Tensor, int] | None",
]
"""slot, where its min and max are in the result buffer, values, (exact, rounded, their
versions) if held, (histogram rows, row) of a full record."""


class _Slot:
    """One gradient's record: None (none kept), a ``_Row`` on the device, the record, or
    ``_SKIPPED`` (a parameter's size, but rounded where no parameter was in sight)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: GradRecord | _Row | object | None = None


_SKIPPED = object()

class _Row:
    """A record whose counts wait on the device: row ``row`` of ``rows``."""

    __slots__ = ("numel", "row", "rows")

    def __init__(self, rows: torch.Tensor, row: int, numel: int) -> None:
        self.rows, self.row, self.numel = rows, row, numel


class _Resolved:
    """``records`` after a flush, as a mapping: views and casts lead to their source."""

    def __init__(self, log: GradientLog) -> None:
        self._log = log

    def get(self, key: torch.Tensor, default: GradRecord | None = None) -> GradRecord | None:
        (record,) = self._log.records_of([key])
        return record if record is not None else default

    def __getitem__(self, key: torch.Tensor) -> GradRecord:
        record = self.get(key)
        if record is None:
            raise KeyError(key)
        return record


