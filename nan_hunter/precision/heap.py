"""Freed heap memory handed back to the system during a pass.

The FP16 emulation computes every FP16 op in FP32: each op allocates FP32 copies of its inputs
and an FP32 result, frees them at once and keeps the FP16 result. Between the kept results the
freed copies leave holes that glibc's allocator keeps resident (they are reused only by blocks
that fit): ~80 MiB on the benchmark transformer at the end of its forward, and more during the
backward, whose gradients come in other sizes. ``trim_heap`` calls glibc's ``malloc_trim(0)``,
which returns the free pages inside the heap, not only at its top: once per forward, before its
first backward, and during the backward every ``BACKWARD_TRIM_BYTES`` of the emulation's
temporaries (``HeapTrimmer``). Every page given back is faulted in again when the heap grows
into it, so trimming more often costs time: on the transformer (in-process A/B, 7 rounds) the
trim before the backward costs 1%, with a trim every 512 MiB 3% (peak RSS 363 -> ~300 MiB), every
256 MiB 9%. Elsewhere than on glibc (macOS, musl) it does nothing.

Blocks of 32 MiB and more (a large model's vocabulary-sized weights, logits and their
gradients, and every FP16/FP32 copy of them) glibc serves with ``mmap`` and unmaps when they are
freed, however often a block of the same size comes back: each one is faulted in anew, page by
page (a 200 MiB copy: 0.2 s, against 0.016 s into memory already mapped). During a scan
(``large_blocks_from_heap``) they come from the heap instead, where a freed block is reused; and
freeing does not trim the heap's top on its own: the trims above say when pages go back.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the symbols already loaded in this process (no library
    search, which would start ``ldconfig``); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_malloc_trim = _load_malloc_trim()


def _load_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt`` (None elsewhere, like ``malloc_trim``)."""
    if _malloc_trim is None:
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt  # type: ignore[no-any-return]


_mallopt = _load_mallopt()
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
"""``mallopt`` parameters (``malloc.h``)."""
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
"""glibc's defaults, put back after a scan."""
_NO_TRIM = 2**31 - 1
_depth = 0


@contextmanager
def large_blocks_from_heap() -> Iterator[bool]:
    """During the block: every block comes from the heap (no ``mmap``), and ``free`` leaves
    the heap's top in place; after it, glibc's defaults (fixed thresholds from then on: glibc's
    dynamic ones cannot be turned back on), and the free pages go back to the system. Nested:
    the outermost block restores. Yields whether it could (glibc)."""
    global _depth
    if _mallopt is None:
        yield False
        return
    if _depth == 0:
        _mallopt(_M_MMAP_MAX, 0)
        _mallopt(_M_TRIM_THRESHOLD, _NO_TRIM)
    _depth += 1
    try:
        yield True
    finally:
        _depth -= 1
        if _depth == 0:
            _mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
            _mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
            trim_heap()


def trim_heap() -> bool:
    """Return the free pages of the C heap to the system; whether it could be asked to."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


BACKWARD_TRIM_BYTES = 512 << 20
"""Bytes of FP32 temporaries the emulation frees during a backward between two trims, at least
(``backward_trim_bytes``)."""
_weight_bytes = 0


@contextmanager
def trims_paced_by(weight_bytes: int) -> Iterator[None]:
    """Within the block, a backward of a model whose parameters take ``weight_bytes``: its
    temporaries (upcast copies of weights and their gradients) are as large as its weights,
    and so is a trim's period (``backward_trim_bytes``). Every page a trim gives back is faulted
    in again by the next temporaries: a trim every 512 MiB costs a 355M-parameter model's scan
    about a tenth of its time."""
    global _weight_bytes
    before, _weight_bytes = _weight_bytes, weight_bytes
    try:
        yield
    finally:
        _weight_bytes = before


def backward_trim_bytes() -> int:
    """The emulation's bytes between two trims in a backward: ``BACKWARD_TRIM_BYTES``, or the
    model's parameter bytes where larger (``trims_paced_by``)."""
    return max(BACKWARD_TRIM_BYTES, _weight_bytes)


class HeapTrimmer:
    """Counts freed bytes; trims the heap each time ``every`` of them have added up."""

    __slots__ = ("_every", "_since", "trims")

    def __init__(self, every: int) -> None:
        self._every = every
        self._since = 0
        self.trims = 0
        """How many times the heap was trimmed (for tests and benchmarks)."""

    def freed(self, nbytes: int) -> None:
        self._since += nbytes
        if self._since >= self._every:
            self._since = 0
            if trim_heap():
                self.trims += 1
