"""The op tracer: a TorchFunctionMode that records every user-level torch call as an ``OpEvent``.

A ``TorchFunctionMode`` sees calls as the user wrote them (``torch.matmul``, ``a * b``,
``F.linear`` inside ``nn.Linear``) before autocast casts their inputs, so an FP32 input that
autocast is about to turn into FP16 inf is still visible. Statistics are cached per tensor
(weakly), so each tensor is reduced once however many ops read it. Backward is observed through
hooks on the autograd nodes of the traced outputs (``backward_hooks``), which ties each gradient
to its forward op. What a call goes through besides its record (the names that tell a view or an
in-place write, the FP32 replay of an op CUDA's autocast refuses) is in ``op_calls``.

The tracer's bookkeeping before and after an op runs inside the model's call: its own failure is
an ``InternalError`` (inline ``try``: no call per op), the op's is passed on as it is.

Nothing on the hot path reads a value back to the host: tensors are queued in a ``StatsQueue``
(one read-back per batch of tensors), call sites are resolved once per (function, code,
instruction) and events are built from the resolved statistics when they are asked for.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch.overrides import TorchFunctionMode

from nan_hunter.core.location import SourceLocation
from nan_hunter.core.nest import call_leaves, leaves, output_leaves
from nan_hunter.errors import OURS_AS_THEY_ARE, InternalError
from nan_hunter.precision.compare import OpObserver
from nan_hunter.precision.failures import PolicyFailure
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.trace import deferred
from nan_hunter.trace.backward_hooks import NodeHooks
from nan_hunter.trace.call_sites import SiteResolver, backward_location, frame_origin
from nan_hunter.trace.deferred import StaleStatistics, StatsQueue, TensorMap, version_of
from nan_hunter.trace.device_queries import (
    asking_frame,
    device_query,
    may_ask_device,
    query_site,
)
from nan_hunter.trace.events import CapturedCall, GradEvent, OpEvent
from nan_hunter.trace.flops import matmul_flops
from nan_hunter.trace.modules import ModuleTracker
from nan_hunter.trace.op_calls import (
    ALLOCATIONS,
    OVERWRITES,
    PARTIAL_WRITES,
    VIEW_OPS,
    base_name,
    call_or_replay,
    detached_copy,
    is_inplace,
    protect_written,
    refuse_nested,
    written_tensors,
)
from nan_hunter.trace.stats import TensorStats

_CUSTOM_FUNCTION = torch.autograd.function.BackwardCFunction
"""The class of every custom ``autograd.Function``'s node (``<Name>Backward``)."""

_AUTOCAST_DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


class _OpRecord(NamedTuple):
    """An op call as recorded on the hot path: statistics are queue slots until resolved."""

    index: int
    op: str
    module: str
    location: SourceLocation | None
    in_user_code: bool
    in_slots: tuple[int, ...]
    out_slots: tuple[int, ...]
    producers: tuple[int | None, ...]
    scalars: tuple[float, ...]
    key: tuple[str, str, int, int]
    in_loss: bool
    autocast: bool
    failure: PolicyFailure | None
    call_site: SourceLocation | None
    custom_function: bool = False
    flops: int = 0
    ints: tuple[int, ...] = ()


class OpTracer(TorchFunctionMode):
    """Records ``OpEvent``s; use ``forward()`` around the forward and ``backward()`` around it.

    ``depth``: how many tensors wait for their statistics before one batched read-back (default
    ``deferred.MAX_PENDING``; 0: each tensor is summarised when it is seen, what a
    ``StaleStatistics`` retry asks for).
    """

    def __init__(
        self,
        modules: ModuleTracker,
        fmt: FloatFormat,
        *,
        count_all: bool = False,
        before_write: Callable[[torch.Tensor], None] | None = None,
        depth: int | None = None,
        exact_zeros: bool = True,
        observer: OpObserver | None = None,
    ) -> None:
        super().__init__()
        self._observer = observer
        """Told each recorded op's tensors (the precision check's comparison)."""
        self._before_write = before_write
        """Called with the tensor an in-place op is about to write (to snapshot weights)."""
        self._modules = modules
        self._fmt = fmt
        self._count_all = count_all
        """Count zeros and tiny values in every output, not only in low-precision ones."""
        if depth is None:
            depth = deferred.MAX_PENDING
        self._queue = StatsQueue(
            fmt, depth=max(depth, 1), on_flush=self._on_flush, exact_zeros=exact_zeros
        )
        self._records: list[_OpRecord] = []
        self._events: list[OpEvent] = []
        self._grad_records: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
        self._grad_events: list[GradEvent] = []
        self._calls: list[tuple[int, Callable[..., Any], Any, int, tuple[int, ...]]] = []
        """Calls that may still turn out to be the first origin (held until their statistics
        are read back): index, function, (args, kwargs) if kept within the byte budget, their
        bytes, versions of their tensors."""
        self._calls_held = 0
        self.first_origin_call: CapturedCall | None = None
        self._origin_found = False
        self._checked = 0
        """Records checked for the first origin so far."""
        self._stats: TensorMap[int] = TensorMap()
        self._producer: TensorMap[int] = TensorMap()
        self._grad_stats: TensorMap[tuple[int, int]] = TensorMap()
        self._occurrences: Counter[tuple[str, str, int]] = Counter()
        self._sites = SiteResolver()
        self._nodes: dict[int, tuple[Any, int]] = {}
        self._paused = False
        self.in_loss = False
        """Set by the runner while the loss function runs."""
        self.escaped: set[int] = set()
        """Indices of ops whose output left a module (a module's or the model's output)."""
        self.device_queries: dict[tuple[str, int], tuple[str, SourceLocation]] = {}
        """Where the user's forward asked which device it runs on (``x.is_cuda``), in order."""
        self.unseen: dict[str, None] = {}
        """Modules (in order) whose outputs an op computed that this mode never saw: an op
        run under ``torch._C.DisableTorchFunction()`` or from C++ code."""
        self.recomputed: dict[str, None] = {}
        """Modules (in order) whose forward ran again inside a backward (a reversible layer's
        or an activation checkpoint's recomputation), where this mode is not active: the ops
        repeat a forward it traced, and are not traced themselves."""
        self._leaf_views: TensorMap[None] = TensorMap()
        """Views (``param.expand(...)``) of tensors no op made (a parameter, a buffer, the
        batch), and views of those: seen by this mode, their values are the leaf's."""
        self.output_bytes = 0
        """Bytes of the traced outputs: what a retained graph may keep alive, at most."""
        self._unwritten: TensorMap[None] = TensorMap()
        """Tensors holding memory no op wrote: an allocation's result (``torch.empty``), its
        views, and what only wrote part of it (``buf[:k] = x``). Their values are not data:
        no statistic of theirs counts until an op reads them as data."""
        self._allocated = False
        """Whether an allocation was seen (the checks for ``_unwritten`` run only then)."""

    @property
    def estimated_zeros(self) -> bool:
        """Whether some zero count is an estimate (``exact_zeros=False``, a large FP16 tensor)."""
        return self._queue.estimated_zeros

    @property
    def host_reads(self) -> int:
        """Batched statistics read-backs so far (for tests and benchmarks)."""
        return self._queue.flushes

    @property
    def events(self) -> list[OpEvent]:
        """The forward op events, statistics resolved (this reads back what is queued)."""
        self._queue.flush()
        stats = self._queue.stats
        for r in self._records[len(self._events) :]:
            self._events.append(
                OpEvent(
                    index=r.index,
                    op=r.op,
                    module=r.module,
                    location=r.location,
                    in_user_code=r.in_user_code,
                    inputs=tuple(stats(s) for s in r.in_slots),
                    outputs=tuple(stats(s) for s in r.out_slots),
                    producers=r.producers,
                    scalars=r.scalars,
                    key=r.key,
                    in_loss=r.in_loss,
                    autocast=r.autocast,
                    failure=r.failure,
                    call_site=r.call_site,
                    custom_function=r.custom_function,
                    flops=r.flops,
                    ints=r.ints,
                )
            )
        return self._events

    @property
    def grad_events(self) -> list[GradEvent]:
        self._queue.flush()
        stats = self._queue.stats
        for index, forward_index, incoming, produced in self._grad_records[
            len(self._grad_events) :
        ]:
            self._grad_events.append(
                GradEvent(
                    index,
                    forward_index,
                    tuple(stats(s) for s in incoming),
                    tuple(stats(s) for s in produced),
                )
            )
        return self._grad_events

    def flush(self) -> None:
        """Read back every queued statistic now."""
        self._queue.flush()

    # -- forward ---------------------------------------------------------------------------
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        # Our bookkeeping before and after the op is ours (``InternalError``); the op call is
        # the model's. Inline ``try``s: free when nothing raises, and no call per op.
        try:
            name = base_name(func)
            flat = call_leaves(args, kwargs)
            in_tensors = [x for x in flat if isinstance(x, torch.Tensor)]
            self._watch_custom_functions(in_tensors)
            view = name in VIEW_OPS
            if not view:
                inplace = is_inplace(name, kwargs)
                if inplace and in_tensors:
                    # The op writes a tensor that may wait in the queue: take its statistics.
                    self._queue.flush()
                if self._allocated:
                    in_slots, blank = self._allocation_slots(name, kwargs, in_tensors, inplace)
                else:
                    in_slots, blank = tuple(self._slot_of(t) for t in in_tensors), set()
                producers = tuple(self._producer.get(t) for t in in_tensors)
                if self._before_write is not None and in_tensors and inplace:
                    protect_written(self._before_write, kwargs, in_tensors)
        except OURS_AS_THEY_ARE:
            raise
        except Exception as exc:
            raise InternalError(exc) from exc
        if view:
            out = func(*args, **kwargs)
            try:
                self._inherit_producer(out, in_tensors)
                self._note_leaf_view(out, in_tensors)
                if self._allocated and in_tensors and in_tensors[0] in self._unwritten:
                    self._mark_unwritten(out)
            except OURS_AS_THEY_ARE:
                raise
            except Exception as exc:
                raise InternalError(exc) from exc
            return out
        out, failure = call_or_replay(func, args, kwargs)
        try:
            out_tensors = [x for x in leaves(out) if isinstance(x, torch.Tensor)]
            if inplace and in_tensors:
                self._stats.pop(in_tensors[0], None)
                if not out_tensors:  # __setitem__ returns None: the mutated tensor is the output
                    out_tensors = [in_tensors[0]]
            if not out_tensors:
                if in_tensors and not self.in_loss and may_ask_device(func):
                    self._note_device_query(func)
                return out
            if name in ALLOCATIONS:
                self._allocated = True
                blank = {id(t) for t in out_tensors}
            if self._allocated:
                in_slots, blank = self._after_allocation_op(
                    in_tensors, in_slots, out_tensors, blank
                )
            self._record(
                func, args, kwargs, flat, in_slots, producers, out_tensors, failure, blank
            )
        except OURS_AS_THEY_ARE:
            raise
        except Exception as exc:
            raise InternalError(exc) from exc
        return out

    def note_cuda_query(self, asked: str, frame: Any) -> None:
        """``torch.cuda.is_available()`` (or ``device_count()``) called by the user's code."""
        if not self._paused and not self.in_loss:
            self._add_device_query(asked, frame)

    def _add_device_query(self, asked: str, frame: Any) -> None:
        where = query_site(frame)
        self.device_queries.setdefault((where.file, where.line), (asked, where))

    def _note_device_query(self, func: Callable[..., Any]) -> None:
        # the code that read the property or called the method (``sys._getframe(2)``)
        frame = asking_frame(sys._getframe(2))
        asked = device_query(func, frame)
        if asked is not None:
            self._add_device_query(asked, frame)

    def _record(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        flat: list[Any],
        in_slots: tuple[int, ...],
        producers: tuple[int | None, ...],
        out_tensors: list[torch.Tensor],
        failure: PolicyFailure | None = None,
        blank: set[int] | frozenset[int] = frozenset(),
    ) -> None:
        """``blank``: ``id``s of the outputs that hold memory no op wrote (no statistics)."""
        op, location, in_user_code, call_site = self._sites.site(sys._getframe(2), func)
        index = len(self._records)
        counts_all = self._count_all
        low = self._fmt.dtype
        out_slots = []
        for t in out_tensors:
            if t.is_nested:  # no statistic (aminmax, counts) has a kernel for one
                refuse_nested(op, self._modules.current)
            self.output_bytes += t.numel() * t.element_size()
            if blank and id(t) in blank:
                slot = self._queue.unwritten(t)
                self._unwritten[t] = None
            else:
                slot = self._queue.add(t, counts_all or t.dtype == low)
            self._stats[t] = slot
            self._producer[t] = index
            out_slots.append(slot)
        site = (op, location.file if location else "", location.line if location else 0)
        self._occurrences[site] += 1
        if not self._origin_found:
            tensors = [x for x in flat if isinstance(x, torch.Tensor)]
            versions = tuple(version_of(x) for x in tensors)
            size = sum(
                x.numel() * x.element_size()
                for x in tensors
                if not isinstance(x, torch.nn.Parameter)  # alive anyway
            )
            if self._queue.depth == 1 or self._calls_held + size <= deferred.MAX_HELD_BYTES:
                self._calls_held += size
                self._calls.append((index, func, (args, kwargs), size, versions))
            else:  # not kept: should this be the origin, the pass runs again eagerly
                self._calls.append((index, func, None, 0, versions))
        self._records.append(
            _OpRecord(
                index,
                op,
                self._modules.current,
                location,
                in_user_code,
                in_slots,
                tuple(out_slots),
                producers,
                tuple(float(x) for x in flat if type(x) is float),
                (*site, self._occurrences[site]),
                self.in_loss,
                any(torch.is_autocast_enabled(d) for d in _AUTOCAST_DEVICES),
                failure,
                call_site,
                False,
                matmul_flops(base_name(func), args, kwargs, out_tensors),
                ints=tuple(x for x in flat if type(x) is int),
            )
        )
        self._watch_backward(out_tensors, index)
        if self._observer is not None:
            self._observer.on_op(
                (*site, self._occurrences[site]),
                [x for x in flat if isinstance(x, torch.Tensor)],
                out_tensors,
            )
        if not self._origin_found and self._queue.pending == 0:
            self._on_flush()  # summarised at once (depth 1): look for the origin now

    def _on_flush(self) -> None:
        """After a read-back: the first op whose inputs are finite and outputs are not is the
        first origin; keep a copy of its arguments for the FP32 rerun."""
        if self._origin_found:
            return
        ready = self._queue.ready
        records = self._records
        calls = {c[0]: c for c in self._calls}
        while self._checked < len(records):
            r = records[self._checked]
            if any(ready(s) is None for s in (*r.in_slots, *r.out_slots)):
                break  # queued after this read-back (an op's outputs span a flush)
            self._checked += 1
            inputs_finite = all(ready(s).finite for s in r.in_slots) and all(  # type: ignore[union-attr]
                v == v and v not in (float("inf"), float("-inf")) for v in r.scalars
            )
            if inputs_finite and not all(ready(s).finite for s in r.out_slots):  # type: ignore[union-attr]
                _, func, kept, _, versions = calls[r.index]
                if kept is None:
                    raise StaleStatistics("the first origin's arguments were not kept")
                args, kwargs = kept
                now = tuple(
                    version_of(x) for x in leaves((args, kwargs)) if isinstance(x, torch.Tensor)
                )
                if now != versions:
                    raise StaleStatistics("the first origin's arguments changed before capture")
                self.first_origin_call = CapturedCall(func, *detached_copy(args, kwargs))
                self._origin_found = True
                self._calls, self._calls_held = [], 0
                return
        self._calls = [c for c in self._calls if c[0] >= self._checked]
        self._calls_held = sum(c[3] for c in self._calls)

    # -- memory no op wrote ------------------------------------------------------------------
    def _allocation_slots(
        self, name: str, kwargs: dict[str, Any], in_tensors: list[torch.Tensor], inplace: bool
    ) -> tuple[tuple[int | None, ...], set[int]]:
        """Input slots when some tensor holds memory no op wrote: such a tensor that the op
        writes (``buf.fill_``, ``buf[:k] = x``, ``out=buf``) gets no statistic, its garbage is no
        input of the op; one it reads is summarised as it is, now if the op writes another
        tensor, else after the op (None), unless the op's result aliases it (a view). Also the
        ``id``s of the outputs that will still hold such memory (a partial write's)."""
        written = written_tensors(kwargs, in_tensors) if inplace and in_tensors else []
        overwrites = "out" in kwargs or name in OVERWRITES
        partial = not overwrites and name in PARTIAL_WRITES
        slots: list[int | None] = []
        blank: set[int] = set()
        for t in in_tensors:
            if t not in self._unwritten:
                slots.append(self._slot_of(t))
            elif any(t is w for w in written):
                if overwrites or partial:
                    slots.append(self._queue.unwritten(t))
                else:  # an op that reads it first (``buf.add_(x)``): its garbage is read
                    slots.append(self._queue.add(t, self._counts(t)))
                if partial:
                    blank.add(id(t))  # still holds memory no op wrote
                else:
                    self._unwritten.pop(t)
            elif inplace:
                slots.append(self._queue.add(t, self._counts(t)))
            else:
                slots.append(None)
        return tuple(slots), blank

    def _after_allocation_op(
        self,
        in_tensors: list[torch.Tensor],
        in_slots: tuple[int | None, ...],
        out_tensors: list[torch.Tensor],
        blank: set[int],
    ) -> tuple[tuple[int, ...], set[int]]:
        """The input slots left for after the op (``_allocation_slots``): no statistic for a
        tensor holding memory no op wrote whose alias the op returned (``buf[:k]``), and the
        alias holds such memory too; the tensor's values, else (it was read)."""
        if all(slot is not None for slot in in_slots):
            return in_slots, blank  # type: ignore[return-value]
        slots = list(in_slots)
        for i, slot in enumerate(in_slots):
            if slot is not None:
                continue
            t = in_tensors[i]
            storage = t.untyped_storage().data_ptr()
            aliases = [o for o in out_tensors if o.untyped_storage().data_ptr() == storage]
            if aliases:
                slots[i] = self._queue.unwritten(t)
                blank.update(id(o) for o in aliases)
            else:
                slots[i] = self._queue.add(t, self._counts(t))
        return tuple(slots), blank  # type: ignore[arg-type]

    def _mark_unwritten(self, out: Any) -> None:
        for t in leaves(out):
            if isinstance(t, torch.Tensor):
                self._unwritten[t] = None

    def _counts(self, t: torch.Tensor) -> bool:
        return self._count_all or t.dtype == self._fmt.dtype

    def _slot_of(self, t: torch.Tensor) -> int:
        slot = self._stats.get(t)
        if slot is None:  # a parameter, buffer or batch tensor
            slot = self._queue.add(t, self._count_all or t.dtype == self._fmt.dtype)
            self._stats[t] = slot
        return slot

    def stats_of(self, t: torch.Tensor) -> TensorStats:
        return self._queue.stats(self._slot_of(t))

    def _inherit_producer(self, out: Any, in_tensors: list[torch.Tensor]) -> None:
        if not in_tensors:
            return
        source = self._producer.get(in_tensors[0])
        if source is None:
            return
        for t in leaves(out):
            if isinstance(t, torch.Tensor):
                self._producer[t] = source

    def _note_leaf_view(self, out: Any, in_tensors: list[torch.Tensor]) -> None:
        """A view op on a tensor no op made (or on such a view): its outputs are seen."""
        if not in_tensors:
            return
        source = in_tensors[0]
        if source.grad_fn is not None and source not in self._leaf_views:
            return  # computed: its producer (if this mode saw one) was inherited
        for t in leaves(out):
            if isinstance(t, torch.Tensor):
                self._leaf_views[t] = None

    def mark_escaped(self, output: Any) -> None:
        """Record the producers of a module's output: values the next layer may cast."""
        outputs = [t for t in output_leaves(output) if isinstance(t, torch.Tensor)]
        if not self._paused:
            self._watch_custom_functions(outputs)
        for t in outputs:
            index = self._producer.get(t)
            if index is not None:
                self.escaped.add(index)
            elif t.grad_fn is not None and not self._paused and t not in self._leaf_views:
                # computed (it has a graph node), and by no op this mode recorded
                module = self._modules.current or "(root)"
                if torch._C._current_graph_task_id() != -1:
                    # inside a backward: a forward recomputed (reversible layers, checkpoints)
                    self.recomputed.setdefault(module)
                else:
                    self.unseen.setdefault(module)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Run nan-hunter's own tensor code (the default loss) without tracing it."""
        previous, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = previous

    def _watch_custom_functions(self, tensors: list[torch.Tensor]) -> None:
        """A tensor that came out of a custom ``autograd.Function`` (seen when an op reads it or
        a module returns it): its backward is the Function's own ``backward``, which no traced
        op's node stands for. It gets a record of its own, the Function named at that method,
        so that a gradient it makes inf is blamed on it and not on the next traced op."""
        for t in tensors:
            node = t.grad_fn
            if isinstance(node, _CUSTOM_FUNCTION) and id(node) not in self._nodes:
                self._record_custom_function(node, t)

    def _record_custom_function(self, node: Any, t: torch.Tensor) -> None:
        function = type(node)._forward_cls
        location = backward_location(function)
        op = f"{function.__qualname__}.apply"
        index = len(self._records)
        slot = self._slot_of(t)
        producer = self._producer.get(t)
        if producer is not None:  # none: made by ops this mode never saw (NH003 says so)
            self._producer[t] = index
        file, line = (location.file, location.line) if location else ("", 0)
        self._occurrences[(op, file, line)] += 1
        self._records.append(
            _OpRecord(
                index,
                op,
                self._modules.current,
                location,
                location is not None and frame_origin(location.file) == "user",
                (slot,),  # the Function's output read as its input: never an origin in forward
                (slot,),
                (producer,),
                (),
                (op, file, line, self._occurrences[(op, file, line)]),
                self.in_loss,
                any(torch.is_autocast_enabled(d) for d in _AUTOCAST_DEVICES),
                None,
                None,
                custom_function=True,
            )
        )
        self._nodes[id(node)] = (node, index)

    # -- backward --------------------------------------------------------------------------
    def _watch_backward(self, out_tensors: list[torch.Tensor], index: int) -> None:
        for t in out_tensors:
            node = t.grad_fn
            if node is not None and id(node) not in self._nodes:
                self._nodes[id(node)] = (node, index)

    def backward_hooks(self) -> NodeHooks:
        """Hooks on the traced nodes for one backward (``with tracer.backward_hooks(): ...``)."""
        return NodeHooks(list(self._nodes.values()), self._on_node, self.flush)

    def begin_backward(self) -> None:
        """Forget the gradients of an earlier backward on the same graph."""
        self._queue.flush()
        self._grad_records, self._grad_events = [], []
        self._grad_stats = TensorMap()

    def release(self) -> None:
        """Drop the autograd nodes held for backward hooks (the graph can go), the calls held
        as origin candidates, and the references that make the tracer and its statistics queue
        a cycle (so that what they hold goes when the pass does, not at the next collection).

        The nodes go newest first: each is then freed alone, its next nodes still held here.
        Oldest first, the graph's last node would free the whole chain below it in one
        recursive deallocation, whose C stack a chain of some thousand ops overflows (SIGSEGV)."""
        nodes = self._nodes
        while nodes:
            nodes.popitem()
        self._calls, self._calls_held = [], 0
        self._before_write = None
        self._queue.detach()

    def _grad_slot(self, g: torch.Tensor) -> int:
        """A gradient's slot: one node's produced gradient is often the next one's incoming."""
        slot = self._grad_stats.get(g)
        if slot is None or version_of(g) != slot[1]:
            slot = (self._queue.add(g, False), version_of(g))
            self._grad_stats[g] = slot
        return slot[0]

    def _on_node(self, forward_index: int, grad_inputs: Any, grad_outputs: Any) -> None:
        slot = self._grad_slot
        incoming = tuple(slot(g) for g in grad_outputs if g is not None)
        produced = tuple(slot(g) for g in grad_inputs if g is not None)
        self._grad_records.append((len(self._grad_records), forward_index, incoming, produced))
