"""The pieces of ``nan-hunter run``'s verdict on a problem step, without a training script:
GradScaler's skips judged per optimizer, the verified fix leading, the verdict on the cause,
its line (the scripts: ``test_run_verdicts.py``).
"""

from __future__ import annotations

from dataclasses import replace

from nan_hunter.findings import (
    Applicability,
    Edit,
    Fix,
    Report,
    ScanTarget,
    StepVerdict,
    TrainingSteps,
)
from nan_hunter.fixes.cost import choose
from nan_hunter.process.script_process import problem_line
from nan_hunter.training.checks import OptimizerStep, ScaleWatch
from nan_hunter.training.diagnosis import Repeats, StepSeen, diagnose
from nan_hunter.training.events import RunEvent
from nan_hunter.training.step_verdict import Reason


def _watch() -> ScaleWatch:
    return ScaleWatch(patience=3, floor=1.0, used=1024.0, settled=False)


def test_skips_of_two_optimizers_sharing_a_scaler_are_judged_per_optimizer() -> None:
    """D skipped, then G, then D: the scale backs off three times in a row, yet no optimizer
    was skipped twice in a row (before, any back-off counted: "3 skips in a row")."""
    watch = _watch()
    scale = 1024.0
    for number, skipped_d in enumerate([False, True, False, True], start=1):
        scale = scale / 2 if skipped_d or number == 3 else scale
        steps = [OptimizerStep("d", skipped_d, 2 * number - 1),
                 OptimizerStep("g", number == 3, 2 * number)]
        assert watch.observe(scale, steps)[2] is None
    assert watch.skipped_total == 3 and watch.in_row == 1


def test_three_skips_in_a_row_of_one_optimizer_are_a_problem_at_its_step() -> None:
    watch = _watch()
    watch.observe(1024.0, [OptimizerStep("d", False, 1, "optimizer 1 (Adam)"),
                           OptimizerStep("g", False, 2, "optimizer 2 (Adam)")])
    problems = [
        watch.observe(1024.0 / 2 ** i, [OptimizerStep("d", False, 2 * i + 1, "optimizer 1 (Adam)"),
                                        OptimizerStep("g", True, 2 * i + 2, "optimizer 2 (Adam)")])
        for i in range(1, 4)
    ]
    assert [p[2] for p in problems[:2]] == [None, None]
    problem = problems[2][2]
    assert problem is not None and problem.reason is Reason.SKIPPED
    assert problem.detail == ("GradScaler skipped 3 steps of optimizer 2 (Adam) in a row (scale "
                              "now 128): the gradients overflow at every scale it tried")
    assert watch.tripped is not None and watch.tripped.number == 8


def test_one_optimizer_without_steps_given_keeps_the_old_judgement() -> None:
    watch = _watch()
    assert watch.observe(1024.0)[2] is None  # went through: settled
    results = [watch.observe(1024.0 / 2 ** i) for i in range(1, 4)]
    assert [r[1] for r in results] == [True, True, True]
    problem = results[2][2]
    assert problem is not None and problem.detail.startswith("GradScaler skipped 3 steps in a row")


def _fix(title: str, verified: bool | None, *alternatives: Fix) -> Fix:
    return Fix(title=title, applicability=Applicability.SAFE,
               edits=(Edit("model.py", 0, 0, title),), diff="x", verified=verified,
               alternatives=alternatives)


def test_a_verified_alternative_leads_a_refuted_fix() -> None:
    """The first proposal is one that works (``fixes.cost.choose``): the refuted fix, no safer
    than the verified ones, is left out; the other verified one follows."""
    narrow = _fix("narrow", False, _fix("grown", True), _fix("function", True))
    lead = choose(narrow)
    assert [lead.title, *(a.title for a in lead.alternatives)] == ["grown", "function"]
    assert lead.alternatives[0].alternatives == ()
    assert choose(_fix("ok", True, _fix("other", True))).title == "ok"
    assert choose(_fix("refuted", False, _fix("also", False))).title == "refuted"


def _report(dtype: str = "float16") -> Report:
    target = ScanTarget(file="train.py", mode="autocast", dtype=dtype, device="cpu",
                        policy="cuda")
    return Report(target=target, findings=(), ops=3, backward_nodes=2, propagated=0,
                  seconds=0.1)


def test_a_clean_rerun_of_a_forward_that_was_not_finite_is_not_reproducible() -> None:
    """Before, any re-run without an error said the values "came from outside its forward"."""
    seen = StepSeen(outputs_finite=False, output_grads_finite=False, loss_finite=False,
                    grads_finite=None)
    verdict, evidence = diagnose(_report(), seen, Repeats("Net", 2, True, False,
                                                          ("Net.calls changed from 4 to 5",),
                                                          (0,)))
    assert verdict is StepVerdict.NOT_REPRODUCIBLE
    assert evidence == (
        "the outputs of Net were not finite in the step; re-run from its inputs and weights "
        "(twice, the second from the random number generators' state of the step's forward), "
        "they are finite (no error: nothing)",
        "state the re-run cannot restore: Net.calls changed from 4 to 5 (a module that changes "
        "at each call)",
        "the step's input tensors 0 were written in place after the call: the re-run read other "
        "data",
        "a transient fault, a non-deterministic kernel, or state the re-run does not restore",
    )


def test_outside_the_forward_only_when_the_outputs_were_finite() -> None:
    seen = StepSeen(outputs_finite=True, output_grads_finite=True, loss_finite=False,
                    grads_finite=None)
    verdict, evidence = diagnose(_report(), seen, Repeats("Net"))
    assert verdict is StepVerdict.OUTSIDE
    assert evidence == ("the outputs of Net were finite in the step and in its re-run (no "
                        "error: nothing); the loss computed from them outside the model was "
                        "not finite",)
    unknown = StepSeen(outputs_finite=None, output_grads_finite=None, loss_finite=False,
                       grads_finite=None)
    assert diagnose(_report(), unknown, Repeats("Net"))[0] is StepVerdict.NOT_REPRODUCIBLE


def test_the_problem_line_says_the_verdict_and_its_evidence() -> None:
    report = _report()
    training = TrainingSteps(3, 4, verdict=StepVerdict.OUTSIDE, evidence=("it came later",))
    event = RunEvent(4, Reason.LOSS, "the loss is nan", replace(report, training=training),
                     "Net", "", None)
    assert problem_line(event, "on stderr") == (
        "training step 4: the loss is nan; outside the model's forward: it came later (report "
        "on stderr)"
    )
