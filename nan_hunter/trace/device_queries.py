"""Recognise a model asking which device it runs on: ``x.is_cuda``, ``x.device.type``.

nan-hunter predicts a CUDA run on a CPU. A forward that branches on the device (an early return
for CPU, an autocast wrapper ``enabled=x.is_cuda``, ``torch.autocast(x.device.type)``) takes the
CPU's path during the scan, not the one a CUDA run takes: the ops of that other path were never
checked. The tracer sees these reads as torch functions (property getters included); this
module tells them apart from the many harmless reads of ``x.device`` (``device=x.device``,
``torch.autocast(x.device.type, ...)``): only a comparison of its type is a question.
"""

from __future__ import annotations

import dis
import linecache
import sys
import threading
from collections.abc import Callable
from functools import lru_cache
from types import CodeType, FrameType
from typing import Any

import torch

from nan_hunter.core.location import SourceLocation
from nan_hunter.core.shared_patch import SharedPatch
from nan_hunter.errors import ours
from nan_hunter.project.paths import is_installed
from nan_hunter.trace.call_sites import frame_origin

_ANSWERING_GETTERS = ((torch.Tensor.is_cuda, "is_cuda"), (torch.Tensor.is_cpu, "is_cpu"))
"""Properties whose value is the answer "which device": any read of them is a device query."""
_DEVICE_GETTER = torch.Tensor.device
_GET_DEVICE = torch.Tensor.get_device


_ASKING_IDS = frozenset(
    {id(getter) for getter, _ in _ANSWERING_GETTERS} | {id(_DEVICE_GETTER)}
)


def may_ask_device(func: Callable[..., Any]) -> bool:
    """Cheap first test, by identity (the tracer sees every ``x.shape``): ``func`` is one of
    the getters or methods ``device_query`` looks at."""
    return func is _GET_DEVICE or id(getattr(func, "__self__", None)) in _ASKING_IDS


def device_query(func: Callable[..., Any], frame: FrameType | None) -> str | None:
    """What ``func``, called from ``frame``, asks about the device (``".is_cuda"``), or
    ``None`` when it is not a device query or not made by the user's own project code."""
    owner = getattr(func, "__self__", None)
    answering = next((name for getter, name in _ANSWERING_GETTERS if owner is getter), None)
    if answering is not None:
        asked = f".{answering}"
    elif func is _GET_DEVICE:
        asked = ".get_device()"
    elif owner is _DEVICE_GETTER and frame is not None and _compares_type(
        frame.f_code, frame.f_lasti
    ):
        asked = ".device.type"
    else:
        return None
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    if frame_origin(filename) != "user" or is_installed(filename):
        return None
    return asked


@lru_cache(maxsize=4096)
def _compares_type(code: CodeType, offset: int) -> bool:
    """The instructions after ``offset`` in ``code`` read ``.type`` and compare it
    (``x.device.type == "cuda"``, ``x.device.type in (...)``). Passing it on as it is
    (``torch.autocast(device_type=x.device.type)``) asks nothing: that follows the device."""
    instructions = list(dis.get_instructions(code))
    for i, instruction in enumerate(instructions):
        if instruction.offset != offset:
            continue
        after = instructions[i + 1 : i + 4]
        if not after or after[0].opname not in ("LOAD_ATTR", "LOAD_METHOD"):
            return False
        if after[0].argval != "type":
            return False
        rest = [a.opname for a in after[1:]]
        return bool(rest) and (
            rest[0] in _COMPARISONS
            or (rest[0] in ("LOAD_CONST", "LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL")
                and len(rest) > 1 and rest[1] in _COMPARISONS)
        )
    return False


_COMPARISONS = frozenset({"COMPARE_OP", "CONTAINS_OP", "IS_OP"})

_MODE_FRAMES = frozenset({"__torch_function__", "call_or_replay"})
"""Frames of nan_hunter's own modes that pass a call on (seen between a call and its caller)."""


def asking_frame(frame: FrameType | None) -> FrameType | None:
    """The frame that made a call, past the frames of our own modes stacked between it and
    ``frame`` (the caller of the mode that saw the call)."""
    while (
        frame is not None
        and frame.f_code.co_name in _MODE_FRAMES
        and frame_origin(frame.f_code.co_filename) == "own"
    ):
        frame = frame.f_back
    return frame


def query_site(frame: FrameType) -> SourceLocation:
    """Where ``frame`` is: the file, the line and its code."""
    line = frame.f_lineno or 0
    code = linecache.getline(frame.f_code.co_filename, line).strip()
    return SourceLocation(file=frame.f_code.co_filename, line=line, code=code)


_LISTENERS = threading.local()
"""Per thread: the callback of the traced pass running in it, for ``torch.cuda`` queries."""


def _asking(original: Callable[..., Any], asked: str) -> Callable[..., Any]:
    def asking(*args: Any, **kwargs: Any) -> Any:
        listener = getattr(_LISTENERS, "current", None)
        if listener is not None:
            _tell(listener, asked, sys._getframe(1))
        return original(*args, **kwargs)

    return asking


@ours
def _tell(listener: Callable[[str, FrameType], None], asked: str, frame: FrameType) -> None:
    """Passes a query from the user's project code (``frame``) on to ``listener``: our own
    code inside the model's call (its failure is an ``InternalError``)."""
    filename = frame.f_code.co_filename
    if frame_origin(filename) == "user" and not is_installed(filename):
        listener(asked, frame)


CUDA_QUERIES = (
    SharedPatch(torch.cuda, "is_available",
                lambda fn: _asking(fn, "torch.cuda.is_available()")),
    SharedPatch(torch.cuda, "device_count", lambda fn: _asking(fn, "torch.cuda.device_count()")),
)
"""``torch.cuda``'s own answers to "is there a GPU", which a forward may branch on as well."""


class CudaQueries:
    """While open (in this thread), ``torch.cuda.is_available()`` and ``device_count()`` called
    from the user's project code are passed to ``listener(asked, frame)``; the functions are
    replaced once for every thread (``SharedPatch``) and put back when the last one closes."""

    def __init__(self, listener: Callable[[str, FrameType], None]) -> None:
        self._listener = listener
        self._held: list[SharedPatch] = []
        self._previous: Any = None

    def __enter__(self) -> CudaQueries:
        try:
            for patch in CUDA_QUERIES:
                patch.acquire()
                self._held.append(patch)
        except BaseException:
            self._release()
            raise
        self._previous = getattr(_LISTENERS, "current", None)
        _LISTENERS.current = self._listener
        return self

    def __exit__(self, *exc: object) -> None:
        _LISTENERS.current = self._previous
        self._release()

    def _release(self) -> None:
        while self._held:
            self._held.pop().release()
