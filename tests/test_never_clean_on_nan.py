"""A NaN or inf loss is never clean: a non-finite constant operand makes its op an origin (a
real bug, NaN in FP32 too), and a non-finite loss no error explains is an error of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

import nan_hunter
from nan_hunter.core.batch import Batch
from nan_hunter.engine.candidate import ScanEvidence
from nan_hunter.engine.runner import PassResult
from nan_hunter.findings import Report
from nan_hunter.precision.formats import FP16
from nan_hunter.project.config import Settings
from nan_hunter.project.loader import load_target
from nan_hunter.rules.nh901_unexplained_non_finite_loss import UnexplainedNonFiniteLoss
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import TensorStats
from tests.conftest import FIXTURES, ROOT, marker_line, scanned


def _errors(report: Report) -> list[tuple[object, ...]]:
    return [
        (f.code, f.kind.value, f.phase.value, f.op, f.module,
         f.location.line if f.location else None, f.origin,
         f.fp32_rerun.finite if f.fp32_rerun else None)
        for f in report.findings if f.is_error
    ]  # fmt: skip


def _cli(path: Path) -> subprocess.CompletedProcess[str]:
    """The real command line, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "nan_hunter", "scan", str(path)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False,
    )


def test_a_nan_python_constant_makes_its_op_a_real_bug_origin() -> None:
    path = FIXTURES / "fx_nan_constant.py"
    report = scanned(path)
    line = marker_line(path, "# <- culprit")
    assert _errors(report) == [
        ("NH301", "nan", "forward", "Tensor.__mul__", "", line, True, False)
    ]
    (finding,) = report.findings
    assert finding.message == (
        "Tensor.__mul__ gets 16 NaN in FP32 as well: not a precision problem: a non-finite "
        "constant operand: float('nan')"
    )
    assert finding.fix is not None and finding.fix.diff is None
    # the addition of float('inf') only carries the NaN on
    assert (report.ops, report.propagated, report.status) == (3, 1, "findings")


def test_a_nan_python_constant_exits_1_through_the_cli() -> None:
    done = _cli(FIXTURES / "fx_nan_constant.py")
    assert done.returncode == 1, done.stderr
    assert "error[NH301] nan: Tensor.__mul__ gets 16 NaN in FP32 as well" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith(
        "findings: 3 ops traced, 3 backward nodes, 1 origin, 1 propagated, 0 warnings"
    )


class _ScaledByBuffer(nn.Module):
    """A buffer holding inf (a 0-d tensor no traced op made) scales a finite result."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)
        self.register_buffer("scale", torch.tensor(float("inf")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


def test_a_tensor_constant_holding_inf_makes_its_op_an_origin() -> None:
    torch.manual_seed(0)
    report = nan_hunter.scan(_ScaledByBuffer(), torch.randn(4, 8))
    line = _ScaledByBuffer.forward.__code__.co_firstlineno + 1
    assert _errors(report) == [
        ("NH301", "inf", "forward", "Tensor.__mul__", "", line, True, False)
    ]
    assert report.findings[0].message == (
        "Tensor.__mul__ gets 16 inf in FP32 as well: not a precision problem: a non-finite "
        "constant operand: a 0-d tensor holding inf that no traced op made (a buffer, a "
        "constant)"
    )
    assert report.propagated == 0


class _CausalMask(nn.Module):
    """A -inf mask a softmax takes in: the -inf is meant, and absorbed before the loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.full((4, 4), float("-inf")).triu(1)
        return torch.softmax(self.fc(x) + mask, dim=-1)


def test_a_minus_inf_mask_a_softmax_absorbs_is_no_origin() -> None:
    torch.manual_seed(0)
    report = nan_hunter.scan(_CausalMask(), torch.randn(4, 4))
    assert _errors(report) == []
    assert report.loss is not None and report.loss.finite
    # full, triu and the addition carry the -inf; the softmax takes it in
    assert report.propagated == 3


def test_a_nan_loss_no_origin_explains_is_an_error() -> None:
    report = scanned(FIXTURES / "nan_loss_untraced.py")
    assert _errors(report) == [("NH901", "nan", "forward", "", "", None, False, None)]
    (finding,) = report.findings
    assert finding.message == (
        "the loss holds 1 NaN and no origin was found: no traced op read or made a NaN or inf, "
        "so it was made by code the tracer did not see; nan-hunter cannot say what made it"
    )
    assert (report.propagated, report.status) == (0, "findings")


def test_a_nan_loss_no_origin_explains_exits_1_through_the_cli() -> None:
    done = _cli(FIXTURES / "nan_loss_untraced.py")
    assert done.returncode == 1, done.stderr
    assert "error[NH901] nan: the loss holds 1 NaN and no origin was found" in done.stdout


def _masking_loss(output: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(output, nan=0.0, posinf=0.0).sum()


def test_a_nan_constant_whose_output_a_loss_masks_is_still_an_origin() -> None:
    """The loss is finite, but the model's output it takes in is not."""
    path = FIXTURES / "fx_nan_constant.py"
    target = load_target(str(path))
    report = nan_hunter.scan(target.model, target.batch, loss_fn=_masking_loss)
    assert report.loss is not None and report.loss.finite
    assert _errors(report) == [
        ("NH301", "nan", "forward", "Tensor.__mul__", "", marker_line(path, "# <- culprit"),
         True, False)
    ]  # fmt: skip


def test_an_ignored_origin_is_not_reported_as_unexplained() -> None:
    """The origin was found; the settings ignore its code: NH901 does not say "no origin"."""
    target = load_target(str(FIXTURES / "fx_nan_constant.py"))
    report = nan_hunter.scan(target.model, target.batch, ignore=["NH301"])
    assert (report.findings, report.propagated) == ((), 1)


def _event(index: int, op: str, outputs: TensorStats, *, producers: tuple[int | None, ...] = (),
           inputs: tuple[TensorStats, ...] = (), in_loss: bool = False) -> OpEvent:
    return OpEvent(index, op, "", None, True, inputs, (outputs,), producers, in_loss=in_loss)


def test_a_nan_model_output_a_loss_function_masks_is_unexplained_without_an_origin() -> None:
    """The loss is finite, the model's output it took in holds NaN, and no traced op made it
    (untraced code wrote into a finite result): NH901 names the output and what the trace
    shows."""
    nan = TensorStats((4,), "float16", 4, nan=4)
    fine = TensorStats((4,), "float16", 4, min=0.0, max=1.0, abs_max=1.0)
    loss = TensorStats((), "float32", 1, min=0.0, max=0.0, abs_max=0.0)
    events = (
        _event(0, "torch.nn.functional.linear", fine),
        _event(1, "Tensor.__add__", nan, inputs=(nan,), producers=(0,)),
        _event(2, "torch.nan_to_num", loss, inputs=(nan,), producers=(1,), in_loss=True),
    )
    low = PassResult(events, (), None, loss, backward_ran=False)
    (finding,) = UnexplainedNonFiniteLoss().detect(
        ScanEvidence(Settings(), FP16, Batch((torch.zeros(4),), {}, None), low)
    )
    assert (finding.code, finding.op, finding.op_index, finding.origin) == (
        "NH901", "Tensor.__add__", 1, False
    )
    assert finding.message == (
        "the model's output holds 4 NaN and no origin was found: the first non-finite value the "
        "trace shows is already an input of Tensor.__add__: no traced op made it; nan-hunter "
        "cannot say what made it"
    )
