"""The verdict on a problem step's cause, from the real step and the re-runs of its model call.

``nan-hunter run`` re-runs the step's model call in the precision it ran in (the scan, with its
FP32 reference pass), and when that finds no error, once more with the random number
generators' state of the step's forward. One verdict (``findings.StepVerdict``) follows, with
the evidence a person can check:

- *precision problem*: the re-run reproduces it and the op is finite in FP32;
- *real bug*: non-finite in FP32 too (or the step ran in FP32, or its inputs were not finite);
- *not reproducible*: the step's model outputs were not finite, the same inputs and weights give
  finite values now; what the re-run could not restore is named where it is known (a module's
  counter that changed, inputs changed in place after the call);
- *outside the model's forward*: only when the step's model outputs were finite and its re-run
  is too, and the non-finite values came in after the forward (the loss, the gradient reaching
  the outputs, the parameters' gradients after the model's backward, another rank);
- *overflow forecast*: no value was non-finite yet, the sampled range map's trend reaches the
  format's limit before the next sample (``run --stop-before-overflow``).

    seen = StepSeen.of(call, problem)              # host syncs: at a problem only
    before = plain_state(replay)
    report = rerun_call(call, replay, ...)
    verdict, evidence = diagnose(report, seen, Repeats(...))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nan_hunter.core.nest import call_leaves
from nan_hunter.findings import Report, Severity, StepVerdict
from nan_hunter.trace import torch_originals as real
from nan_hunter.trace.deferred import version_of
from nan_hunter.trace.summary import format_number
from nan_hunter.training.rerun import ModelCall
from nan_hunter.training.step_verdict import Problem, Reason

_STATE_TYPES = (bool, int, float)


@dataclass(frozen=True)
class StepSeen:
    """What the real step showed (None: not known)."""

    outputs_finite: bool | None
    """The model call's outputs, as the step computed them."""
    output_grads_finite: bool | None
    """The gradient that reached those outputs in the step's backward."""
    loss_finite: bool | None
    grads_finite: bool | None
    """The parameters' gradients the optimizer was about to apply."""
    other_rank: bool = False
    forecast: str = ""
    """The forecast that made a finite step a problem (``--stop-before-overflow``)."""

    @classmethod
    def of(cls, call: ModelCall | None, problem: Problem) -> StepSeen:
        """Read at the problem step (host syncs: on a problem only)."""
        outputs = grads = None
        if call is not None and call.values:
            outputs = all(bool(real.isfinite(v).all()) for v in call.values)
        if call is not None and call.grads:
            grads = all(bool(real.isfinite(g).all()) for g in call.grads.values())
        reason = problem.reason
        return cls(
            outputs_finite=outputs,
            output_grads_finite=grads,
            loss_finite=False if reason is Reason.LOSS else None,
            grads_finite=(
                False if reason in (Reason.GRADIENT, Reason.SKIPPED, Reason.SCALE_COLLAPSE)
                else None
            ),
            other_rank=reason is Reason.OTHER_RANK,
            forecast=problem.detail if reason is Reason.FORECAST else "",
        )


@dataclass(frozen=True)
class Repeats:
    """How the step was re-run and what it could not restore."""

    model: str
    """The re-run model's class name."""
    runs: int = 1
    """Re-runs made: 2 when the first found no error."""
    rng_restored: bool = False
    """A re-run started from the random number generators' state of the step's forward."""
    reproduced_with_rng: bool = False
    """Only that re-run reproduced it (the first, with other random numbers, did not)."""
    changed_state: tuple[str, ...] = ()
    """Module attributes the forward changed (``Net.calls changed from 4 to 6``): state a
    copy of the model carries as it was after the step's forward, not before it."""
    changed_inputs: tuple[int, ...] = ()
    """Inputs (positions among the call's tensors) written in place since the call."""


def plain_state(module: torch.nn.Module) -> dict[str, Any]:
    """The Python numbers and flags each submodule holds (a call counter, a step count), by
    ``Class.path.name``: what a forward may change and a re-run cannot set back."""
    root = type(module).__name__
    state: dict[str, Any] = {}
    for path, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key.startswith("_") or key == "training" or not isinstance(value, _STATE_TYPES):
                continue
            state[".".join(p for p in (root, path, key) if p)] = value
    return state


def changed_state(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, ...]:
    return tuple(
        f"{name} changed from {value!r} to {after[name]!r}"
        for name, value in before.items() if name in after and after[name] != value
    )


def input_versions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
    """The version counter of each tensor among a call's inputs (in-place writes bump it)."""
    return tuple(
        version_of(x) for x in call_leaves(args, kwargs) if isinstance(x, torch.Tensor)
    )


def changed_inputs(call: ModelCall) -> tuple[int, ...]:
    """Positions of the call's input tensors written in place since the call."""
    now = input_versions(call.args, call.kwargs)
    return tuple(
        i for i, (then, later) in enumerate(zip(call.versions, now, strict=False))
        if then != later and then >= 0
    )


def diagnose(
    report: Report, seen: StepSeen, repeats: Repeats
) -> tuple[StepVerdict, tuple[str, ...]]:
    """The verdict and its evidence, the first sentence the one ``run``'s line shows."""
    errors = [f for f in report.active if f.severity is Severity.ERROR]
    if errors:
        return _reproduced(report, repeats)
    found = "nothing" if not report.active else (
        f"{len(report.active)} warning{'s' * (len(report.active) != 1)}"
    )
    if seen.forecast:
        return StepVerdict.FORECAST, (
            "no value was non-finite yet: the sampled range map's trend reaches the format's "
            "limit before the next sample",
            f"the re-run of {repeats.model} from the step's inputs and weights finds no error "
            f"({found}): its range map shows the headroom left",
        )
    if seen.outputs_finite is True:
        entered = _entered_after(seen)
        if entered is not None:
            return StepVerdict.OUTSIDE, (
                f"the outputs of {repeats.model} were finite in the step and in its re-run "
                f"(no error: {found}); {entered}",
            )
    twice = (" (twice, the second from the random number generators' state of the step's "
             "forward)" if repeats.rng_restored else " (twice)") if repeats.runs > 1 else ""
    evidence = [
        (f"the outputs of {repeats.model} were not finite in the step; re-run from its inputs "
         f"and weights{twice}, they are finite (no error: {found})")
        if seen.outputs_finite is False else
        f"the re-run of {repeats.model} from the step's inputs and weights{twice} finds no "
        f"error ({found})"
    ]
    evidence += [f"state the re-run cannot restore: {change} (a module that changes at each "
                 "call)" for change in repeats.changed_state]
    if repeats.changed_inputs:
        which = ", ".join(str(i) for i in repeats.changed_inputs)
        evidence.append(f"the step's input tensors {which} were written in place after the "
                        "call: the re-run read other data")
    evidence.append("a transient fault, a non-deterministic kernel, or state the re-run does "
                    "not restore")
    return StepVerdict.NOT_REPRODUCIBLE, tuple(evidence)


def _entered_after(seen: StepSeen) -> str | None:
    """Where the non-finite values came in after the forward, or None when nothing shows it."""
    if seen.loss_finite is False:
        return "the loss computed from them outside the model was not finite"
    if seen.output_grads_finite is False:
        return ("the gradient reaching the outputs was not finite: it came in after the "
                "forward (the loss's backward, a hook on an output)")
    if seen.other_rank:
        return "another rank saw the problem (its gradients, its loss)"
    if seen.grads_finite is False and seen.output_grads_finite is True:
        return ("the gradient reaching the outputs was finite and so is the model's backward "
                "re-run from it, but the parameters' gradients were not: they changed after the "
                "model's backward (a gradient hook, another rank's all-reduce)")
    return None


def _reproduced(report: Report, repeats: Repeats) -> tuple[StepVerdict, tuple[str, ...]]:
    first = next(f for f in report.active if f.severity is Severity.ERROR)
    at = f"{first.code} {first.op or 'input'}"
    rng = (
        ("only with the random number generators' state of the step's forward (the first "
         "re-run, with other random numbers, was finite)",)
        if repeats.reproduced_with_rng else ()
    )
    dtype = report.target.dtype
    if dtype == "float32":  # a step that ran in FP32, re-run so
        return StepVerdict.REAL_BUG, (
            f"the re-run in float32, the precision the step ran in, is non-finite at {at}", *rng
        )
    if first.code == "NH001":
        return StepVerdict.REAL_BUG, ("the step's inputs hold NaN or inf before the model "
                                      "runs: the data, not the precision", *rng)
    rerun = first.fp32_rerun
    if rerun is not None:
        reach = f" (|x| <= {format_number(rerun.abs_max)})" if rerun.abs_max is not None else ""
        if not rerun.finite:
            return StepVerdict.REAL_BUG, (
                f"the re-run in {dtype} reproduces it at {at}, and in FP32 it is non-finite "
                "there too", *rng
            )
        return StepVerdict.PRECISION, (
            f"the re-run in {dtype} reproduces it at {at}; in FP32 the same op is finite{reach}",
            *rng,
        )
    reference = report.reference_loss
    if reference is not None and not reference.finite:
        return StepVerdict.REAL_BUG, (
            f"the re-run in {dtype} reproduces it at {at}, and the FP32 loss is not finite "
            "either", *rng
        )
    if reference is not None:
        return StepVerdict.PRECISION, (
            f"the re-run in {dtype} reproduces it at {at}; the FP32 re-run's loss is finite",
            *rng,
        )
    return StepVerdict.PRECISION, (
        f"the re-run in {dtype} reproduces it at {at}, a failure of {dtype} only", *rng
    )
