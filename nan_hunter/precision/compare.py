"""Each op's low-precision result against the same op's FP32 result: the precision check.

The low-precision pass keeps its ops' floating outputs (``KeptOutputs``, detached, within a byte
budget) and its gradients; the FP32 reference pass, traced, hands each op's outputs to an
``ErrorMeter`` that finds the kept ones by the op's key (``OpEvent.key``: op, file, line,
occurrence) and measures, without a read-back per op::

    error = max |low - fp32| / max |fp32|      (robust to zeros; 0 when both are 0)

and, where the low-precision values may be integers past the format's exact range (above 256 in
BF16, 2048 in FP16), whether the FP32 values are integers. After the backward it compares the
flattened gradient vectors (their cosine). ``ErrorMeter.result()`` reads everything back at once.

The tracer calls ``on_op(key, inputs, outputs)`` after each recorded op, and
``on_gradients(grads)`` after a traced backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from nan_hunter.precision.formats import FloatFormat
from nan_hunter.trace import torch_originals as real

OpKey = tuple[str, str, int, int]


class OpObserver(Protocol):
    """What a traced pass tells the precision check: each recorded op's tensors (inputs in the
    order of ``OpEvent.inputs``), and the gradients of a traced backward."""

    def on_op(
        self, key: OpKey, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
    ) -> None: ...

    def on_gradients(self, grads: tuple[torch.Tensor | None, ...]) -> None: ...

MAX_KEPT_BYTES = 1 << 30
"""At most this many bytes of low-precision outputs are kept for the comparison (1 GiB); the ops
after that are not compared (``PrecisionCheck.compared`` says how many were)."""


@dataclass(frozen=True)
class OpError:
    """One op's measured error against FP32 (its outputs together)."""

    error: float
    """max |low - fp32| / max |fp32| over its floating outputs; inf where only one is 0."""
    ref_abs_max: float
    integer_outputs: bool = False
    """The FP32 outputs are integers, some beyond the format's exact range."""
    integer_inputs: tuple[int, ...] = ()
    """Positions of FP32 inputs that are integers beyond the format's exact range."""


@dataclass(frozen=True)
class PrecisionCheck:
    """What the comparison measured: per op key, and for the gradients."""

    errors: dict[OpKey, OpError] = field(default_factory=dict)
    grad_cosine: float | None = None
    """Cosine of the flattened low-precision and FP32 gradient vectors (None: no backward)."""
    kept_all: bool = True
    """False when the byte budget left later ops uncompared."""


class KeptOutputs:
    """The low-precision pass's side: each op's floating outputs, by key, and the gradients."""

    def __init__(self, max_bytes: int = MAX_KEPT_BYTES) -> None:
        self.outputs: dict[OpKey, tuple[tuple[torch.Tensor, int] | None, ...]] = {}
        self.grads: tuple[torch.Tensor | None, ...] = ()
        self._bytes = 0
        self._max = max_bytes
        self._closed = False
        self.kept_all = True

    def on_op(
        self, key: OpKey, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
    ) -> None:
        if self._closed:
            return  # compared already (a recount's forward runs after)
        old = self.outputs.pop(key, None)  # the same op again (a pass run anew)
        if old is not None:
            self._bytes -= sum(_nbytes(t) for t, _ in filter(None, old))
        size = sum(_nbytes(t) for t in outputs if t.is_floating_point())
        if self._bytes + size > self._max:
            self.kept_all = False
            return
        self._bytes += size
        self.outputs[key] = tuple(
            (t.detach(), t._version) if t.is_floating_point() and not t.is_inference() else None
            for t in outputs
        )

    def on_gradients(self, grads: tuple[torch.Tensor | None, ...]) -> None:
        if self._closed:
            return
        self.grads = tuple(g.detach() if g is not None else None for g in grads)

    def release(self) -> None:
        """Let go of everything kept; nothing is kept after."""
        self.outputs, self.grads, self._closed = {}, (), True


class ErrorMeter:
    """The FP32 reference pass's side: each op's error against ``kept``'s, read back once.

    ``integer_checks``: the keys whose values may be integers past ``fmt``'s exact range (from
    the low-precision pass's statistics), with the input positions to check."""

    def __init__(
        self, kept: KeptOutputs, fmt: FloatFormat, integer_checks: dict[OpKey, tuple[int, ...]]
    ) -> None:
        self._kept, self._fmt, self._checks = kept, fmt, integer_checks
        self._keys: list[OpKey] = []
        self._values: list[torch.Tensor] = []
        """Per measured key: [max |low - fp32|, max |fp32|, integer outputs, integer inputs...]."""
        self._cosine: torch.Tensor | None = None
        """The gradients' 2 x 2 Gram matrix, float64: [[low.low, low.ref], [low.ref, ref.ref]]."""
        self._scratch = _Scratch()

    def on_op(
        self, key: OpKey, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
    ) -> None:
        kept = self._kept.outputs.pop(key, None)
        if kept is None or len(kept) != len(outputs):
            return
        diffs, mags = [], []
        with torch.no_grad():
            for pair, ref in zip(kept, outputs, strict=True):
                if pair is None or not ref.is_floating_point() or ref.is_complex():
                    continue
                low, version = pair
                if low._version != version or low.shape != ref.shape or low.numel() == 0:
                    return  # written over in place since: nothing to compare with
                diff, mag = self._scratch.max_abs_diff(low, ref.detach())
                diffs.append(diff)
                mags.append(mag)
            if not diffs:
                return
            if len(diffs) == 1:
                row = [diffs[0], mags[0]]
            else:
                row = [torch.stack(diffs).amax(), torch.stack(mags).amax()]
            positions = self._checks.get(key)
            if positions is not None:
                row.append(_integers([o for o in outputs if o.is_floating_point()], self._fmt))
                row += [_integers([inputs[i]], self._fmt) for i in positions if i < len(inputs)]
            self._values.append(torch.stack([v.float() for v in row]))
        self._keys.append(key)

    def on_gradients(self, grads: tuple[torch.Tensor | None, ...]) -> None:
        self._scratch = _Scratch()  # the pass is over: its buffer goes
        low = self._kept.grads
        if len(low) != len(grads):
            return
        pairs = [
            (a.detach(), b.detach())
            for a, b in zip(low, grads, strict=True)
            if a is not None and b is not None and a.shape == b.shape
        ]
        self._cosine = _gram(pairs)

    def result(self) -> PrecisionCheck:
        """Everything measured, read back in one go."""
        self._scratch = _Scratch()
        errors: dict[OpKey, OpError] = {}
        flat = torch.cat([v.cpu() for v in self._values]).tolist() if self._values else []
        start = 0
        for key, row in zip(self._keys, self._values, strict=True):
            values = flat[start : start + row.numel()]
            start += row.numel()
            diff, mag = values[0], values[1]
            error = _relative(diff, mag)
            positions = self._checks.get(key, ())
            integer_outputs = len(values) > 2 and values[2] > 0
            integer_inputs = tuple(
                p for p, flag in zip(positions, values[3:], strict=False) if flag > 0
            )
            errors[key] = OpError(error, mag, integer_outputs, integer_inputs)
        cosine = None
        if self._cosine is not None:
            (a, dot), (_, b) = self._cosine.tolist()
            cosine = dot / math.sqrt(a * b) if a > 0 and b > 0 else (1.0 if a == b else 0.0)
        return PrecisionCheck(errors, cosine, self._kept.kept_all)


def _relative(diff: float, mag: float) -> float:
    if math.isnan(diff) or math.isnan(mag):
        return math.inf
    if mag == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / mag


FP32_EXACT_INTEGERS = 2.0**24
"""Past this every FP32 value is an integer: a value there (a ``-1e9`` or ``finfo.min`` mask
fill) being whole says nothing about counting, so it is no position or count."""


class _Scratch:
    """``max |low - ref|`` and ``max |ref|`` of one op's output without a temporary of its own:
    the difference is written into a buffer kept for the whole pass (per device), grown to the
    largest output. A fresh tensor per op, the size of an activation, costs more than the
    arithmetic on a CPU, where it is faulted in page by page after each heap trim."""

    def __init__(self) -> None:
        self._buffers: dict[torch.device, torch.Tensor] = {}

    def max_abs_diff(
        self, low: torch.Tensor, ref: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both as 0-d FP32 tensors, as ``low.float() - ref.float()`` gives them."""
        if (
            torch.promote_types(low.dtype, ref.dtype) != torch.float32
            or low.layout != torch.strided
            or ref.layout != torch.strided
        ):
            # FP64, both in the low format (a cast the model makes itself), or a sparse
            # tensor: in FP32 first, a tensor of its own
            ref32 = ref.float()
            return (low.float() - ref32).abs().amax(), ref32.abs().amax()
        n = ref.numel()
        buffer = self._buffers.get(ref.device)
        if buffer is None or buffer.numel() < n:
            buffer = self._buffers[ref.device] = torch.empty(
                n, dtype=torch.float32, device=ref.device
            )
        diff = buffer[:n].view(ref.shape)
        torch.sub(low, ref, out=diff)  # in FP32 (type promotion), as ``low.float() - ref``
        lowest, highest = torch.aminmax(ref)
        mag = torch.maximum(lowest.abs(), highest.abs()).float()
        return diff.abs_().amax(), mag


GRAM_CHUNK = 1 << 16
"""Values per gradient chunk of ``_gram`` on a CPU (two rows of FP64: 1 MiB, in cache)."""
GRAM_CHUNK_DEVICE = 1 << 22
"""... and on an accelerator (fewer, larger kernels)."""


def _gram(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The 2 x 2 FP64 Gram matrix of the flattened gradient vectors ``a`` and ``b`` (their dot
    products), on their device, not read back. Chunk by chunk: both chunks copied into the two
    rows of one FP64 buffer (each product of two FP32 values is exact in FP64), and one
    ``buffer @ buffer.T`` gives the three sums; no FP64 copy of a whole gradient is made (the
    FP64 copies and products of GPT-2 medium's 355M gradient values took 4-6 s on a CPU, most
    of it faulting fresh memory in)."""
    pairs = [(_flat(a), _flat(b)) for a, b in pairs]
    pairs = [(a, b) for a, b in pairs if a.numel() > 0]
    if not pairs:
        return torch.zeros(2, 2, dtype=torch.float64)
    device = pairs[0][0].device
    chunk = GRAM_CHUNK if device.type == "cpu" else GRAM_CHUNK_DEVICE
    longest = max(a.numel() for a, _ in pairs)
    buffer = torch.empty(2, min(chunk, longest), dtype=torch.float64, device=device)
    gram = torch.zeros(2, 2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for a, b in pairs:
            n = a.numel()
            for start in range(0, n, chunk):
                end = min(n, start + chunk)
                rows = buffer[:, : end - start]
                rows[0].copy_(a[start:end])
                rows[1].copy_(b[start:end])
                gram += rows @ rows.T
    return gram


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A gradient as a flat real tensor (a sparse one densified, a complex one's real part)."""
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_complex():
        t = t.real
    return t.reshape(-1)


def _integers(tensors: list[torch.Tensor], fmt: FloatFormat) -> torch.Tensor:
    """1 when every value of ``tensors`` is an integer and some is beyond ``fmt``'s exact
    integers (256 in BF16), none beyond FP32's (2**24), else 0 (a 0-d tensor: no read-back
    here)."""
    flags = []
    for t in tensors:
        x = t.detach()
        if not x.is_floating_point() or x.numel() == 0:
            return torch.zeros(())
        whole = real.isfinite(x).all() & (x == x.round()).all()
        largest = x.abs().amax()
        flags.append(whole & (largest > fmt.exact_integers) & (largest <= FP32_EXACT_INTEGERS))
    if not flags:
        return torch.zeros(())
    return torch.stack(flags).all().float()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
