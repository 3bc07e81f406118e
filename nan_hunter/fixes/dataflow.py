"""Which fixes can change what another finding computes: one FP32 forward with a data-flow probe.

Verification re-scans independent fixes together (``nan_hunter.fixes.grouping``). Whether two
fixes are independent is measured, not guessed from module names: the model's forward and loss
run once in FP32 (on a copy of the model, without gradients) under a ``TorchFunctionMode`` that
labels every op's outputs with the *pieces of code* it ran in, and passes the labels on from
inputs to outputs (through in-place writes and views too: labels are kept per storage).

A piece of code is a set of ``(file, first line, last line)`` ranges of the original source: a
fix's edited lines plus its finding's op line (and the op's call site in the project). An op
runs in a piece when any frame on its Python stack is inside one of the ranges, so an op in a
library called from an edited line counts.

``depends[k]`` holds every other piece whose labelled values reached an op that ran in piece
``k`` (an input of that op, or the op running inside both pieces at once): a fix there can
change what ``k``'s op or ``k``'s edited code computes. ``unconfined`` holds the pieces with an
edited range in which no op ran (an edit in ``__init__``, at import time, in a branch this batch
does not take): what such an edit changes is not seen by the probe, so it is never combined.

Not seen (documented limits): values that leave tensors (``.item()``, ``.tolist()``, Python
control flow on them) and the backward pass; ``nan_hunter.fixes.grouping`` states what that means
for combining.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from nan_hunter.core.batch import Batch, LossFn


@dataclass(frozen=True)
class CodeRange:
    """Lines ``first``..``last`` (1-based, inclusive) of ``file`` (a resolved path)."""

    file: str
    first: int
    last: int
    edited: bool = True
    """An edited range (must see an op run in it, else the piece is unconfined); False for the
    finding's op line, which is watched but need not run."""


@dataclass(frozen=True)
class Dataflow:
    depends: Mapping[Hashable, frozenset[Hashable]]
    unconfined: frozenset[Hashable]

    def independent(self, a: Hashable, b: Hashable) -> bool:
        if a in self.unconfined or b in self.unconfined:
            return False
        return b not in self.depends.get(a, frozenset()) and a not in self.depends.get(
            b, frozenset()
        )


def probe_dataflow(
    run: Callable[[], Any], pieces: Mapping[Hashable, Sequence[CodeRange]]
) -> Dataflow:
    """Run ``run`` (the model's forward and loss, FP32, no gradients) under the probe."""
    probe = _Probe(pieces)
    with probe:
        run()
    exercised = probe.exercised
    unconfined = frozenset(
        key
        for key, ranges in pieces.items()
        if any(r.edited and (key, i) not in exercised for i, r in enumerate(ranges))
    )
    return Dataflow(
        {key: frozenset(probe.depends.get(key, ())) for key in pieces}, unconfined
    )


class _Probe(TorchFunctionMode):
    def __init__(self, pieces: Mapping[Hashable, Sequence[CodeRange]]) -> None:
        super().__init__()
        self._by_file: dict[str, list[tuple[Hashable, int, CodeRange]]] = {}
        for key, ranges in pieces.items():
            for i, r in enumerate(ranges):
                self._by_file.setdefault(os.path.realpath(r.file), []).append((key, i, r))
        self._files: dict[str, str | None] = {}  # co_filename -> watched realpath or None
        self._labels: dict[int, frozenset[Hashable]] = {}  # storage pointer -> labels
        self.depends: dict[Hashable, set[Hashable]] = {}
        self.exercised: set[tuple[Hashable, int]] = set()

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        before = {_pointer(t) for t in inputs}
        carried: frozenset[Hashable] = frozenset().union(
            *(self._labels.get(p, frozenset()) for p in before)
        )
        here = self._pieces_on_stack()
        for key in here:
            self.depends.setdefault(key, set()).update(
                (carried | frozenset(here)) - {key}
            )
        out = func(*args, **kwargs)
        labels = carried | frozenset(here)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                pointer = _pointer(t)
                if pointer in before:  # written in place, or a view: both keep the labels
                    self._labels[pointer] = self._labels.get(pointer, frozenset()) | labels
                else:
                    self._labels[pointer] = labels
        return out

    def _pieces_on_stack(self) -> set[Hashable]:
        found: set[Hashable] = set()
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name not in self._files:
                real = os.path.realpath(name) if not name.startswith("<") else name
                self._files[name] = real if real in self._by_file else None
            watched = self._files[name]
            if watched is not None:
                line = frame.f_lineno
                for key, i, r in self._by_file[watched]:
                    if r.first <= line <= r.last:
                        found.add(key)
                        self.exercised.add((key, i))
            frame = frame.f_back
        return found


def _pointer(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage (a meta or sparse tensor)
        return id(t)


def model_probe(
    model: torch.nn.Module, batch: Batch, loss_fn: LossFn | None
) -> Callable[[Mapping[Hashable, Sequence[CodeRange]]], Dataflow]:
    """A probe of ``model``'s forward and loss on ``batch``, to be run once: FP32, without
    gradients, on a deep copy of the model (the model and the random state are left as they
    were). It lets go of the model when it runs, so the re-scans after it do not hold it."""
    from nan_hunter.engine.traced_forward import default_loss

    held = [(model, batch, loss_fn)]

    def probe(pieces: Mapping[Hashable, Sequence[CodeRange]]) -> Dataflow:
        if not held:
            raise RuntimeError("the data-flow probe of a model runs once")
        original, inputs, loss = held.pop()
        copy = deepcopy(original)
        del original
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []

        def run() -> None:
            output = copy(*inputs.args, **inputs.kwargs)
            if loss is not None:
                loss(output, inputs.raw)
            else:
                default_loss(output)

        with torch.random.fork_rng(devices=devices), torch.no_grad():
            return probe_dataflow(run, pieces)

    return probe
