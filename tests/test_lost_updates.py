"""Updates lost in low-precision weights (issue 39): ``nan-hunter run`` samples an optimizer
step and says when ``w - lr * g`` rounded back to ``w`` for most weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.findings import Report
from nan_hunter.precision.lost_updates import UpdateSnapshot
from nan_hunter.project.config import load_settings
from nan_hunter.project.loader import load_target
from nan_hunter.training import run_steps
from tests.conftest import ROOT

SCRIPT = str(ROOT / "tests" / "run_scripts" / "low_precision_weights_train.py")
runner = CliRunner()


def test_the_snapshot_counts_elements_a_nonzero_gradient_did_not_move() -> None:
    w = torch.nn.Parameter(torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.bfloat16))
    w.grad = torch.tensor([1e-5, 0.5, 0.0, 1e-5], dtype=torch.bfloat16)
    fp32 = torch.nn.Parameter(torch.ones(3))
    fp32.grad = torch.full((3,), 1e-5)
    snapshot = UpdateSnapshot.take([w, fp32])
    assert snapshot is not None
    with torch.no_grad():
        w -= w.grad  # 1 - 1e-5 is 1.0 in BF16; 1 - 0.5 moves
        fp32 -= fp32.grad
    lost = snapshot.compare(7)
    assert lost is not None
    assert (lost.step, lost.lost, lost.updated, lost.parameters) == (7, 2, 3, 1)
    assert lost.share == pytest.approx(2 / 3)
    assert lost.line() == (
        "the update left 66.7% of the 3 weights with a nonzero gradient unchanged (1 bfloat16 "
        "parameter): w - lr * g rounds back to w in bfloat16, so training stalls without a NaN"
    )
    assert UpdateSnapshot.take([fp32]) is None  # FP32 weights: nothing to watch


@pytest.mark.parametrize(("dtype", "share"), [("bfloat16", "99.8%"), ("float16", "96.4%")])
def test_run_says_once_that_low_precision_weights_do_not_move(dtype: str, share: str) -> None:
    result = runner.invoke(app, ["run", "--no-save-repro", "--dtype", dtype, SCRIPT,
                                 "--dtype", dtype])
    assert result.exit_code == 0, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if "rounds back" in ln]
    assert lines == [
        f"nan-hunter: warning: training step 1: the update left {share} of the 577 weights with "
        f"a nonzero gradient unchanged (4 {dtype} parameters): w - lr * g rounds back to w in "
        f"{dtype}, so training stalls without a NaN; fix: keep the parameters in FP32 (FP32 "
        "master weights: train under torch.autocast instead of model.half()/.to(bfloat16)), or "
        "use an optimizer with stochastic rounding or Kahan summation for low-precision weights"
    ]


def test_fp32_master_weights_under_autocast_are_not_flagged() -> None:
    result = runner.invoke(app, ["run", "--no-save-repro", "--dtype", "bfloat16", SCRIPT,
                                 "--master"])
    assert result.exit_code == 0, result.stderr
    assert "rounds back" not in result.stderr


def test_a_large_parameter_is_looked_at_through_an_even_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At most ``SAMPLED`` elements of each parameter are copied (a BF16 7B model's weights are
    not doubled at the sampled step); the share is that of the sample."""
    import nan_hunter.precision.lost_updates as lost_updates

    monkeypatch.setattr(lost_updates, "SAMPLED", 4)
    w = torch.nn.Parameter(torch.ones(16, dtype=torch.bfloat16))
    w.grad = torch.full((16,), 1e-5, dtype=torch.bfloat16)
    w.grad[8:] = 0.5  # the second half moves
    snapshot = UpdateSnapshot.take([w])
    assert snapshot is not None
    with torch.no_grad():
        w -= w.grad
    lost = snapshot.compare(1)
    assert lost is not None
    assert (lost.lost, lost.updated) == (2, 4)  # elements 0, 4 stayed; 8, 12 moved


WEIGHTS = ROOT / "tests" / "fixtures" / "precision" / "low_precision_weights.py"


def _steps_report(dtype: str, mode: str) -> Report:
    settings = load_settings(None, {"dtype": dtype, "mode": mode, "device": "cpu"})
    return run_steps(load_target(str(WEIGHTS)), settings, 3, lr=1e-4).report


def test_steps_in_bf16_weights_report_nh604_with_the_share() -> None:
    """The share, and the remedy measured: the same step with FP32 master weights."""
    (finding,) = _steps_report("bfloat16", "half").findings
    assert (finding.code, finding.severity.value, finding.kind.value) == (
        "NH604", "warning", "precision"
    )
    assert finding.message == (
        "optimizer step 1 of --steps: the update left 100% of the 577 weights with a nonzero "
        "gradient unchanged (4 bfloat16 parameters): w - lr * g rounds back to w in bfloat16, "
        "so training stalls without a NaN (with FP32 master weights, the same step of the same "
        "training under autocast left 0% unchanged); keep the parameters in FP32 (FP32 master "
        "weights: train under torch.autocast instead of model.half()/.to(bfloat16)), or use an "
        "optimizer with stochastic rounding or Kahan summation for low-precision weights"
    )
    assert finding.fix is not None and "FP32 master weights" in finding.fix.title


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_steps_with_fp32_master_weights_have_no_nh604(dtype: str) -> None:
    """The same model and learning rate under autocast: the parameters stay FP32, nothing is
    copied, nothing is reported."""
    assert [f.code for f in _steps_report(dtype, "autocast").findings] == []


def test_fp16_adam_on_fp16_weights_breaks_before_it_stalls() -> None:
    """In FP16 Adam's eps (1e-8) is 0 and a squared gradient underflows: the first update
    divides by 0, and the next step's loss is NaN: that step is the scan's, as any step that
    breaks; no NH604 is claimed for an update that made the weights non-finite (they moved)."""
    settings = load_settings(None, {"dtype": "float16", "mode": "half", "device": "cpu"})
    result = run_steps(load_target(str(WEIGHTS)), settings, 3, lr=1e-4)
    assert result.first_bad_step == 1
    assert "NH604" not in [f.code for f in result.report.findings]


def test_the_master_weights_measure_is_left_out_when_that_training_fails() -> None:
    """A model that cannot train under autocast (here: it refuses to) gets NH604 without the
    measured remedy: what was not measured is not said."""

    class HalfOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = load_target(str(WEIGHTS)).model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if torch.is_autocast_enabled("cpu"):
                raise RuntimeError("this model does not run under autocast")
            return self.inner(x)

    target = load_target(str(WEIGHTS))
    target = dataclasses.replace(target, model=HalfOnly())
    settings = load_settings(None, {"dtype": "bfloat16", "mode": "half", "device": "cpu"})
    (finding,) = run_steps(target, settings, 2, lr=1e-4).report.findings
    assert finding.code == "NH604"
    assert "with FP32 master weights" not in finding.message.split(";")[0]
