"""Findings: what a scan reports, as frozen data. ``nan_hunter.report.render(report, format)``
(also ``nan_hunter.render``) turns a ``Report`` into text; the data imports nothing above it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from nan_hunter.core.location import SourceLocation
from nan_hunter.core.range_map import RangeMap
from nan_hunter.precision.scale_window import ScaleWindow
from nan_hunter.precision.work import PrecisionWork
from nan_hunter.trace.summary import TensorStats


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Kind(str, enum.Enum):
    NAN = "nan"
    INF = "inf"
    OVERFLOW = "overflow"
    UNDERFLOW = "underflow"
    BAD_INPUT = "bad_input"
    BANNED_OP = "banned_op"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    OUT_OF_RANGE = "out_of_range"
    NOT_CHECKED = "not_checked"
    PRECISION = "precision"


class Phase(str, enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"


LOSS_RTOL = 0.05
"""How far a fixed model's loss may be from the original's FP32 loss (relative): the
verification's tolerance, and the bound under which an unsafe fix counts as measured harmless."""


class Applicability(str, enum.Enum):
    """How safe a fix is to apply without review, ordered as in Ruff."""

    DISPLAY_ONLY = "display-only"
    UNSAFE = "unsafe"
    SAFE = "safe"


@dataclass(frozen=True)
class OpRef:
    """A short reference to another op, e.g. the upstream op that caused a culprit."""

    op: str
    module: str
    location: SourceLocation | None
    reason: str


class StepVerdict(str, enum.Enum):
    """The cause of a training step's non-finite values, as the re-run of its model call shows
    it (``nan-hunter run``)."""

    PRECISION = "precision_problem"
    """The re-run in the step's precision reproduces it, and the same op is finite in FP32."""
    REAL_BUG = "real_bug"
    """Non-finite in FP32 too (or the step ran in FP32, or its inputs were not finite)."""
    NOT_REPRODUCIBLE = "not_reproducible"
    """The step's model outputs were not finite, but the same inputs and weights give finite
    values now: a transient fault, a non-deterministic kernel, or state the re-run does not
    restore."""
    OUTSIDE = "outside_forward"
    """The step's model outputs were finite and its re-run is too: the non-finite values came
    in after the forward (the loss computed outside the model, a gradient hook, another
    rank)."""
    FORECAST = "overflow_forecast"
    """No value was non-finite yet: the forecast of the sampled range map says a module
    overflows before the next sample (``run --stop-before-overflow``)."""

    @property
    def label(self) -> str:
        return _VERDICT_LABELS[self]


_VERDICT_LABELS = {
    StepVerdict.PRECISION: "precision problem",
    StepVerdict.REAL_BUG: "real bug",
    StepVerdict.NOT_REPRODUCIBLE: "not reproducible",
    StepVerdict.OUTSIDE: "outside the model's forward",
    StepVerdict.FORECAST: "overflow forecast",
}


@dataclass(frozen=True)
class Fp32Rerun:
    """The culprit op in the FP32 reference run of the same model and batch."""

    finite: bool
    abs_max: float | None
    own_inputs_finite: bool | None = None
    """The op rerun in FP32 on its own (low-precision) inputs upcast; None if not rerun."""


@dataclass(frozen=True)
class Edit:
    """Replace ``[start, end)`` of a file's decoded text (BOM excluded) with ``replacement``.

    Offsets are ``str`` indices; nan-hunter's edits replace whole lines."""

    file: str
    start: int
    end: int
    replacement: str
    planned_on: str = ""
    """Digest of the text the edit was planned on (``fixes.edits.text_digest``); applying it
    to a file whose text has another digest is refused. Empty: not checked."""


@dataclass(frozen=True)
class FixCost:
    """How much of the model a fix moves to FP32, measured in its verifying re-scan.

    Shares of the forward's work in FP32 after the fix and in the original scan
    (``nan_hunter.precision.work``): the matmul/conv FLOPs, and the values the other ops
    write. What counts is the increase: autocast keeps some ops in FP32 by policy anyway."""

    fp32_matmul_share: float
    fp32_elementwise_share: float
    baseline_matmul_share: float
    baseline_elementwise_share: float
    shared: bool = False
    """Measured in one re-scan with other, independent fixes: the increase in the modules of
    this fix's finding (and those holding them) is counted as this fix's."""
    low_precision: str = "FP16"
    """The format the rest of the model runs in (``FP16``, ``BF16``)."""

    @property
    def added_matmul_share(self) -> float:
        """The share of matmul/conv FLOPs the fix moves from low precision to FP32."""
        return max(self.fp32_matmul_share - self.baseline_matmul_share, 0.0)

    @property
    def added_elementwise_share(self) -> float:
        return max(self.fp32_elementwise_share - self.baseline_elementwise_share, 0.0)

    @property
    def rank(self) -> tuple[float, float]:
        """Cheaper first: matmul/conv FLOPs moved, then elementwise work moved (each rounded
        to 0.1 point, so that noise in the last digits does not outrank a smaller diff)."""
        return (round(self.added_matmul_share, 3), round(self.added_elementwise_share, 3))

    @property
    def most_of_the_model(self) -> bool:
        """The fix moves more than half of the matmul/conv FLOPs to FP32."""
        return self.added_matmul_share > 0.5

    def render(self) -> str:
        """``keeps 98.7% of matmul/conv FLOPs in FP16 (moves 1.3% to FP32; elementwise
        0.4%)``: what stays in low precision after the fix, and what the fix moved."""
        kept = (1.0 - self.fp32_matmul_share) * 100
        text = (f"keeps {kept:.1f}% of matmul/conv FLOPs in {self.low_precision} (moves "
                f"{self.added_matmul_share * 100:.1f}% to FP32; elementwise "
                f"{self.added_elementwise_share * 100:.1f}%)")
        if self.shared:
            text += " with the fixes verified beside it"
        if self.most_of_the_model:
            text += ": most of the model in FP32"
        return text


@dataclass(frozen=True)
class Fix:
    """What to change, as Ruff has it: edits plus an applicability the rule chose.

    ``diff`` is the edits rendered as a unified diff with paths relative to the project root;
    it is never parsed back: applying, combining and SARIF ``fixes`` all work on ``edits``."""

    title: str
    applicability: Applicability
    edits: tuple[Edit, ...] = ()
    diff: str | None = None
    verified: bool | None = None
    """True when the re-scan of the project with this fix applied no longer has the error at
    the edited op and no error the original scan lacked; False otherwise; None when not run."""
    remaining: tuple[str, ...] = ()
    """What the re-scan of the fixed project still reports (``NH102 op at file:line``), or why
    it could not run."""
    alternatives: tuple[Fix, ...] = ()
    """Other fixes for the same finding, usually less safe (an eps FP16 can hold); the
    selection takes the first one that may be applied."""
    cost: FixCost | None = None
    """How much of the model the fix moves to FP32, measured in the re-scan that verified it
    (None: not re-scanned, or the re-scan did not run)."""
    fp32_loss_change: float | None = None
    """How much the fix changes what the model computes: the FP32 loss of the patched model
    relative to the original's FP32 loss (``0.0002`` is 0.02%), measured by the verification
    re-scan; None when not measured."""
    fp32_module: str | None = None
    """The module (path from the model's root) the fix keeps whole in FP32, where it keeps one:
    a library submodule kept by hooks from the user's file, or the library model a call-site
    region runs; ``covers`` reads it (a module holding another cannot cost less)."""

    @property
    def measured_harmless(self) -> bool:
        """An unsafe fix that the re-scan verified and whose measured change of the FP32 loss
        is within the verification's tolerance: ``--fix`` and ``--fix-all`` take it without
        ``--unsafe-fixes`` (it stays labelled unsafe)."""
        return (
            self.applicability is Applicability.UNSAFE
            and self.verified is True
            and self.fp32_loss_change is not None
            and abs(self.fp32_loss_change) < LOSS_RTOL
        )

    @property
    def file(self) -> str | None:
        """The first edited file."""
        return self.edits[0].file if self.edits else None

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.file for e in self.edits))


def loss_change_text(change: float) -> str:
    """``FP32 loss changes by 0.02%``: a fix's measured change, for the report and the notes."""
    percent = abs(change) * 100
    shown = f"{percent:.0f}" if percent >= 10 else f"{percent:.2g}"
    return f"FP32 loss changes by {shown}%"


@dataclass(frozen=True)
class Suppression:
    """A ``# nan-hunter: ignore[CODE] -- reason`` comment that suppresses a finding."""

    reason: str
    file: str
    line: int


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    kind: Kind
    phase: Phase
    op: str
    module: str
    location: SourceLocation | None
    origin: bool
    message: str
    fp32_rerun: Fp32Rerun | None = None
    fix: Fix | None = None
    inputs: tuple[TensorStats, ...] = ()
    outputs: tuple[TensorStats, ...] = ()
    upstream: OpRef | None = None
    op_index: int | None = None
    call_site: SourceLocation | None = None
    """The nearest frame in the user's project, when the op's own location is outside it (an
    installed library, the standard library): where the fix goes."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    suppression: Suppression | None = None
    """Set when an inline comment suppresses the finding: it is listed, but not counted."""
    modules: tuple[str, ...] = ()
    """Every module the finding covers, when it covers several (NH402 warnings with the same
    cause at the same source line are one finding); ``module`` is the first."""

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR


@dataclass(frozen=True)
class ScanTarget:
    """What was scanned, and how: the ``target`` object of the JSON report."""

    file: str
    mode: str
    dtype: str
    device: str
    policy: str
    notes: tuple[str, ...] = ()
    """How the model was taken: wrappers removed (torch.compile, DataParallel)."""
    loss_scaling: LossScaling | None = None
    """The loss scale the backward modelled (None: no backward ran)."""
    unchecked: tuple[str, ...] = ()
    """What this scan did not check, and why (the backward, when it could not run): a report
    without findings is only "clean" for what it checked."""


@dataclass(frozen=True)
class LossScaling:
    """The loss scale a scan's backward modelled, as a training run applies it."""

    policy: str
    """``none`` (no loss scaling), ``fixed`` (the given scale) or ``dynamic`` (GradScaler's
    default: 2**16, halved per step whose gradients overflow)."""
    initial: float
    used: float
    """The scale of the analysed backward (dynamic: where GradScaler settles)."""
    skipped: int = 0
    """Dynamic: steps GradScaler would skip before settling at ``used``."""

    def render(self) -> str:
        """``GradScaler 2**16, dynamic`` (GradScaler's default), ``loss scale 1024``, ``no loss
        scaling``."""
        if self.policy == "none":
            return "no loss scaling"
        if self.policy == "fixed":
            return f"loss scale {scale_text(self.used)}"
        settled = (
            f", backed off to {scale_text(self.used)} after {self.skipped} skipped step"
            f"{'s' if self.skipped != 1 else ''}"
            if self.skipped
            else ""
        )
        return f"GradScaler {scale_text(self.initial)}, dynamic{settled}"


def scale_text(scale: float) -> str:
    """A power of two as ``2**k``, anything else as a number."""
    import math

    exponent = math.log2(scale) if scale > 0 else 0.5
    if exponent == int(exponent):
        return f"2**{int(exponent)}"
    return f"{scale:.3g}"


@dataclass(frozen=True)
class ReproBundle:
    """The folder ``nan-hunter run`` saved a problem step into (``nan-hunter scan
    PATH/model.py`` reproduces it), or why it did not."""

    path: str
    size_bytes: int
    """Bytes written; when not ``written``, the bytes it would have needed (0: unknown)."""
    written: bool
    note: str = ""
    """What was left out, or why nothing was written."""


@dataclass(frozen=True)
class RangeTrend:
    """A module whose largest forward value grows steadily toward the format's limit over the
    sampled steps of a run (``nan-hunter run``'s forecast, ``training.forecast``)."""

    module: str
    steps: tuple[int, ...]
    """The sampled optimizer steps the trend is fitted on."""
    abs_max: tuple[float, ...]
    """The module's forward max |x| at each of them."""
    grad_abs_max: tuple[float | None, ...]
    """The backward max |g| at its outputs, at the loss scale (None: no gradient reached it)."""
    tiny_share: tuple[float | None, ...]
    """The share of its nonzero low-precision values below the smallest normal (None: its
    outputs were not low precision)."""
    doubling_steps: float
    """Optimizer steps for max |x| to double, by the log-linear fit."""
    overflow_step: int | None
    """The step at which the fit reaches ``limit``."""
    limit: float
    fmt: str

    def line(self) -> str:
        """``head.proj doubles every ~180 steps (max |x| 1.20e+04 at step 900): at this rate it
        overflows float16 around step 1,240``."""
        return (
            f"{self.module} doubles every ~{self.doubling_steps:,.0f} steps (max |x| "
            f"{self.abs_max[-1]:.3g} at step {self.steps[-1]:,}): at this rate it overflows "
            f"{self.fmt} around step {self.overflow_step:,}"
        )


@dataclass(frozen=True)
class TrainingSteps:
    """What ``nan-hunter run`` checked of a training script: the ``training`` object of the
    JSON report (absent from ``scan``'s reports)."""

    steps_checked: int
    """Optimizer steps checked and found clean (before ``problem_step`` when there is one)."""
    problem_step: int | None = None
    """The 1-based optimizer step the report re-ran (with no torch optimizer, the backward's
    count); None: no problem step was found."""
    losses_checked: int = 0
    """Backward passes whose loss was checked with no torch optimizer seen (weights updated by
    hand): the loss only, not the gradients nor the update."""
    verdict: StepVerdict | None = None
    """What the re-run of the problem step shows about its cause (None: no step was re-run)."""
    evidence: tuple[str, ...] = ()
    """What the verdict rests on, one sentence each, the first the one ``run``'s line shows."""

    repro: ReproBundle | None = None
    """The reproduction bundle of the problem step (``--save-repro``), when one was tried."""
    forecast: tuple[RangeTrend, ...] = ()
    """The modules forecast to overflow from the sampled steps, the earliest first."""
    samples: int = 0
    """The steps whose range map was sampled for the forecast (0: the forecast was off or no
    step was sampled)."""

    @property
    def nothing_checked(self) -> bool:
        return not self.steps_checked and not self.losses_checked and self.problem_step is None


@dataclass(frozen=True)
class Failed:
    """A path of a multi-path run that could not be scanned (load error, model error)."""

    path: str
    message: str


@dataclass(frozen=True)
class PrecisionVerdict:
    """How far the low-precision step is from FP32's (the precision check, ``--precision-check``
    or ``--dtype bfloat16``)."""

    loss_error: float | None
    """|low-precision loss - FP32 loss| / |FP32 loss| (None: a loss was not finite)."""
    grad_cosine: float | None
    """Cosine between the flattened low-precision and FP32 gradient vectors (None: no
    backward)."""
    compared: int
    """Ops whose outputs were compared with FP32's."""
    largest_error: float | None = None
    """The largest per-op relative error measured (max |low - fp32| / max |fp32|)."""
    largest_at: str = ""
    """Where it was: ``op (file:line)``."""
    complete: bool = True
    """False when the byte budget left some ops uncompared."""

    def render(self) -> str:
        """``loss off by 0.12%, gradient cosine 0.99993, 41 ops compared``."""
        parts = [
            "loss not finite" if self.loss_error is None
            else f"loss off by {percent_text(self.loss_error)}"
        ]
        if self.grad_cosine is not None:
            parts.append(f"gradient cosine {self.grad_cosine:.5f}")
        parts.append(f"{self.compared} ops compared" + ("" if self.complete else " (budget hit)"))
        if self.largest_error is not None and self.largest_at:
            largest = percent_text(self.largest_error)
            parts.append(f"largest op error {largest} at {self.largest_at}")
        return ", ".join(parts)


def percent_text(value: float) -> str:
    """``0.0123`` -> ``1.23%`` (three significant digits), ``inf`` as itself."""
    if value == float("inf"):
        return "inf"
    return f"{value * 100:.3g}%"


@dataclass(frozen=True)
class Report:
    target: ScanTarget
    findings: tuple[Finding, ...]
    ops: int
    """Forward op calls traced (the loss included)."""
    backward_nodes: int
    """Backward nodes observed."""
    propagated: int
    """Op calls that only carried NaN/inf from an earlier origin."""
    seconds: float
    warnings_total: int = 0
    """All warnings found, including those beyond ``max_warnings`` that are not listed."""
    loss: TensorStats | None = None
    loss_scale: ScaleWindow | None = None
    """The loss-scale window measured in the emulated backward (None when it did not run)."""
    reference_loss: TensorStats | None = None
    """The loss of the FP32 reference run (None when it did not run): what a fix must keep."""
    range_map: RangeMap | None = None
    """How close each module's values came to the format's limits, forward and backward (None
    when no pass ran: the batch itself was bad)."""
    training: TrainingSteps | None = None
    """``nan-hunter run``: the training steps checked (None for ``scan``)."""
    precision: PrecisionWork | None = None
    """How much of the low-precision pass's work ran in FP32, per module (None when no pass
    ran): a fix's cost is measured against it."""
    precision_check: PrecisionVerdict | None = None
    """The loss and gradients against FP32's, when the precision check ran."""

    @property
    def active(self) -> tuple[Finding, ...]:
        """The findings that count: all but those suppressed by an inline comment."""
        return tuple(f for f in self.findings if f.suppression is None)

    @property
    def suppressed(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.suppression is not None)

    @property
    def errors(self) -> int:
        return sum(1 for f in self.active if f.severity is Severity.ERROR)

    @property
    def warnings(self) -> int:
        listed = sum(1 for f in self.findings if f.severity is Severity.WARNING)
        active = sum(1 for f in self.active if f.severity is Severity.WARNING)
        return max(self.warnings_total - (listed - active), active)

    @property
    def status(self) -> str:
        """``findings``; ``clean``; ``not_checked``: a ``run`` that saw no step to check."""
        if self.active:
            return "findings"
        if self.training is not None and self.training.nothing_checked:
            return "not_checked"
        return "clean"

    def exit_code(self, fail_on: str = "error") -> int:
        threshold = {Severity.ERROR} if fail_on == "error" else {Severity.ERROR, Severity.WARNING}
        return 1 if any(f.severity in threshold for f in self.active) else 0

