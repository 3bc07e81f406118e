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
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable


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


def trim_heap() -> bool:
    """Return the free pages of the C heap to the system; whether it could be asked to."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


BACKWARD_TRIM_BYTES = 512 << 20
"""Bytes of FP32 temporaries the emulation frees during a backward between two trims."""


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
