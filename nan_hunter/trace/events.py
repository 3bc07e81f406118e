"""What a traced run records: one event per op call in forward, one per op's backward node."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from nan_hunter.core.location import SourceLocation
from nan_hunter.precision.failures import PolicyFailure
from nan_hunter.trace.stats import TensorStats


@dataclass(frozen=True)
class OpEvent:
    """One user-level torch op call in the forward pass (loss included)."""

    index: int
    op: str
    module: str
    location: SourceLocation | None
    in_user_code: bool
    inputs: tuple[TensorStats, ...]
    outputs: tuple[TensorStats, ...]
    producers: tuple[int | None, ...]
    """For each input tensor, the index of the op that produced it (None: a parameter, the
    batch, or a tensor made outside the traced ops)."""
    scalars: tuple[float, ...] = ()
    """Python float arguments, in call order (an ``eps`` lives here)."""
    key: tuple[str, str, int, int] = ("", "", 0, 0)
    """(op, file, line, occurrence): identifies the same call in another run of the model."""
    in_loss: bool = False
    """The op ran in ``loss_fn`` rather than in the model's forward."""
    autocast: bool = True
    """Autocast was enabled where the op ran (False inside ``autocast(enabled=False)``)."""
    failure: PolicyFailure | None = None
    """The op failed the way CUDA fails (banned under autocast, FP16 linear algebra); the scan
    went on with the op run in FP32."""
    call_site: SourceLocation | None = None
    """When ``location`` is in an installed library (site-packages, the standard library): the
    nearest frame outside it, in the user's project, where a fix can go."""
    custom_function: bool = False
    """A custom ``autograd.Function``: ``op`` is ``<Name>.apply``, ``location`` the ``def
    backward`` line (its backward is the Function's own code, not a traced op's)."""
    flops: int = 0
    """Matmul and convolution FLOPs of the call (``nan_hunter.trace.flops``); 0 for any other
    op."""
    ints: tuple[int, ...] = ()
    """Python int arguments, in call order (a reduction's ``dim``)."""

    @cached_property
    def inputs_finite(self) -> bool:
        return all(s.finite for s in self.inputs) and all(
            v == v and v not in (float("inf"), float("-inf")) for v in self.scalars
        )

    @cached_property
    def outputs_finite(self) -> bool:
        return all(s.finite for s in self.outputs)


@dataclass(frozen=True)
class GradEvent:
    """The backward of one forward op: gradients it received and the ones it produced."""

    index: int
    forward_index: int
    incoming: tuple[TensorStats, ...]
    produced: tuple[TensorStats, ...]

    @cached_property
    def incoming_finite(self) -> bool:
        return all(s.finite for s in self.incoming)

    @cached_property
    def produced_finite(self) -> bool:
        return all(s.finite for s in self.produced)

    @property
    def is_origin(self) -> bool:
        return self.incoming_finite and not self.produced_finite


@dataclass(frozen=True)
class CapturedCall:
    """An op call kept for a rerun: the function and detached copies of its arguments."""

    func: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
