"""Freed heap memory handed back to the system between the forward and the backward.

The FP16 emulation computes every FP16 op in FP32: each op allocates FP32 copies of its inputs
and an FP32 result, frees them at once and keeps the FP16 result. Between the kept results the
freed copies leave holes that glibc's allocator keeps resident (they are reused only by blocks
that fit), ~80 MiB on the benchmark transformer at the end of its forward, and the backward's
gradients, of other sizes, grow the heap beside them. ``trim_heap`` calls glibc's
``malloc_trim(0)``, which returns the free pages inside the heap, not only at its top. Trimming
more often (during the passes) takes the peak lower still, but every page given back is faulted
in again when the heap grows into it: every 64 MiB of temporaries cost a quarter of the scan's
time. Elsewhere than on glibc (macOS, musl) it does nothing.
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
