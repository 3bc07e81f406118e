"""What the analysis hands the rules: one origin candidate with everything a rule may look at
to classify it (``Candidate``), and the whole scan for rules that find their own sites
(``ScanEvidence``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nan_hunter.core.batch import Batch
from nan_hunter.engine.precision_loss import PrecisionEvidence
from nan_hunter.engine.runner import PassResult
from nan_hunter.findings import Finding, Phase
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.gradients import GradientLog, ScaleWindow
from nan_hunter.precision.lost_updates import LostUpdates
from nan_hunter.project.config import Settings
from nan_hunter.trace.events import GradEvent, OpEvent

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Upstream:
    """An earlier op that made the culprit's inputs wrong in low precision only."""

    event: OpEvent
    reason: str
    """``"eps"``: a Python scalar that rounds to 0; ``"flush"``: values flushed to 0;
    ``"cancel"``: a subtraction of values that are equal in low precision (its zeros are the
    operands' rounding, never an underflow: two distinct FP16 numbers differ by at least a
    subnormal)."""
    reference: OpEvent | None = None
    """The same op in the FP32 reference run."""
    constants: tuple[RoundedConstant, ...] = ()
    """For ``"cancel"``: Python numbers on the way there that round to 0 or ±1 in low
    precision (``1 - 1e-5`` is 1.0 in FP16), nearest first."""
    lost_eps: RoundedConstant | None = None
    """For ``"flush"``: an add on the way whose constant (a Python number, or a 0-dim tensor
    as the FP32 run sees it: a buffer) is 0 or subnormal in low precision: the eps the flushed
    values were meant to be guarded by (``torch.sqrt(var + 1e-9)``)."""


@dataclass(frozen=True)
class RoundedConstant:
    """A Python number an op reads whose low-precision value is a boundary (0, ±1)."""

    value: float
    rounded: float
    event: OpEvent


@dataclass(frozen=True)
class Candidate:
    """Everything a rule may look at for one finding candidate."""

    phase: Phase
    event: OpEvent
    """The forward op (for a backward finding: the op whose backward produced the gradient)."""
    fmt: FloatFormat
    reference: OpEvent | None = None
    """The same op in the FP32 reference run."""
    grad: GradEvent | None = None
    ref_grad: GradEvent | None = None
    cast_inputs: tuple[int, ...] = ()
    """Positions of FP32 inputs beyond the format's range that autocast cast down."""
    upstream: Upstream | None = None
    own_inputs_finite: bool | None = None
    producer_lines: tuple[int, ...] = ()
    """Lines (same file) of the ops that produced the out-of-range operands."""
    ref_backward_finite: bool | None = None
    """For a backward op with no backward node in FP32: whether the whole FP32 backward was."""
    scale_window: ScaleWindow | None = None
    """Loss scales that keep the FP16 gradients healthy (emulated backward only)."""
    grad_scale: float = 1.0
    """The loss scale the backward ran with."""
    input_producers: tuple[OpEvent, ...] = ()
    """The ops that produced this op's inputs (forward only)."""
    out_of_range_consumers: tuple[OpEvent, ...] = ()
    """Ops after this one (same file) whose FP32 values are still beyond the format's range,
    and the first that brings them back: where a half-mode region must end."""
    back_in_range: tuple[int, ...] = ()
    """The indices of the ``out_of_range_consumers`` whose FP32 values are within the
    format's range again (``* 1e-3`` after an overflowing einsum): where a value computed in
    FP32 may be cast back."""
    consumers: tuple[OpEvent, ...] = ()
    """The ops that take this op's result, in trace order (``analysis.consumer_map``): what
    follows a masked value (an add after ``finfo.min`` is -inf in FP16)."""
    rounded_chain: tuple[OpEvent, ...] = ()
    """When FP32 fails on the op's own low-precision inputs: the ops upstream, in the same
    file, whose results were rounded to the low-precision format (the region grows to them)."""
    contained: bool = False
    """The non-finite values only reach integer/boolean results: harmless to training."""
    absorbed_by: tuple[OpEvent, ...] = ()
    """The ops that turned the non-finite values finite again on every path, computing what
    they compute in FP32, when none reached a module output, the loss or a gradient
    (``analysis.absorbers``): an inf the model absorbs (XLNet's ``1e30 * mask`` into a
    softmax)."""
    constants: tuple[str, ...] = ()
    """The op's non-finite constant operands (``float('nan')``, a buffer holding inf) when they,
    not its traced inputs, made it an origin (``analysis.nonfinite_constants``)."""

    @property
    def ref_finite(self) -> bool | None:
        if self.phase is Phase.BACKWARD:
            if self.ref_grad is None:
                return self.ref_backward_finite
            return all(s.finite for s in self.ref_grad.produced)
        if self.reference is None:
            return None
        return self.reference.outputs_finite

    @property
    def ref_abs_max(self) -> float | None:
        stats = self.ref_grad.produced if self.phase is Phase.BACKWARD and self.ref_grad else (
            self.reference.outputs if self.reference else ()
        )
        values = [s.abs_max for s in stats if s.abs_max is not None]
        return max(values) if values else None

    @property
    def op_name(self) -> str:
        return self.event.op.rsplit(".", 1)[-1].strip("_")


@dataclass(frozen=True)
class ScanEvidence:
    """Everything a site rule may look at: the settings, the batch and, once it ran, the
    low-precision pass with its gradient log and loss-scale window."""

    settings: Settings
    fmt: FloatFormat
    batch: Batch
    low: PassResult | None = None
    log: GradientLog | None = None
    window: ScaleWindow | None = None
    scale: float = 1.0
    """The loss scale the low-precision backward ran with."""
    model: torch.nn.Module | None = None
    """The model as the user gave it (restored after the passes)."""
    errors: tuple[Finding, ...] = ()
    """For stage ``"final"``: the error findings of every other rule."""
    precision: PrecisionEvidence | None = None
    """The precision check's per-op errors against FP32 (None: the check did not run)."""
    lost_updates: LostUpdates | None = None
    """The first optimizer step of ``--steps`` whose low-precision weights lost half or more of
    their updates to rounding (None: none did, or no step was measured)."""
