"""Every pass whose loss is compared starts from the same random state: the low-precision pass,
the FP32 reference, and the passes of each verification re-scan (the FP32 loss included). A
model with dropout draws the same masks in all of them, so a correct fix is not refuted by the
verifier's own noise; the caller's random state is still what it was."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

from nan_hunter import scan
from nan_hunter.api import scan_file
from nan_hunter.engine.scan import scan_target
from nan_hunter.project.config import load_settings
from nan_hunter.project.loader import Target, as_batch
from tests.conftest import FIXTURES, marker_line

DROPOUT = FIXTURES / "dropout_overflow.py"


def _fixture() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_dropout_overflow", DROPOUT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the verification re-imports the model's classes
    spec.loader.exec_module(module)
    return module


def test_a_correct_fix_of_a_model_with_dropout_is_verified() -> None:
    # Before: the reference drew other masks than the re-scan ("the loss changed: -0.0101
    # after the fix, 0.0311 in FP32 before it") and every candidate was refuted.
    report = scan_file(str(DROPOUT))
    (finding,) = [f for f in report.findings if f.is_error]
    assert finding.location is not None
    assert (finding.code, finding.op, finding.location.line) == (
        "NH102", "Tensor.__matmul__", marker_line(DROPOUT, "# <- culprit")
    )
    fix = finding.fix
    assert fix is not None
    assert (fix.title, fix.verified, fix.remaining) == (
        "Compute Tensor.__matmul__ in FP32 (autocast disabled)", True, ()
    )
    assert fix.fp32_loss_change == 0.0


def test_scan_verifies_it_too_and_leaves_the_callers_random_state() -> None:
    fixture = _fixture()
    model, batch = fixture.build_model(), fixture.sample_batch()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    report = scan(model, batch)
    assert torch.equal(torch.rand(3), expected)
    (finding,) = [f for f in report.findings if f.is_error]
    assert finding.fix is not None and (finding.fix.verified, finding.fix.remaining) == (True, ())


def test_the_low_precision_loss_and_the_fp32_loss_share_their_masks() -> None:
    """A clean model with dropout: its FP16 loss and its FP32 loss (the measure a re-scan
    makes) differ by FP16's rounding only, not by other masks (before: 0.0214 against
    -0.00123)."""

    class Dropped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(self.fc(x))

    torch.manual_seed(0)
    target = Target(
        model=Dropped(), batch=as_batch(torch.randn(8, 16), source="batch"), loss_fn=None,
        file=Path(__file__), module_name=__name__,
    )
    report = scan_target(target, load_settings(), fp32_loss=True)
    assert report.status == "clean"
    assert report.loss is not None and report.reference_loss is not None
    assert report.loss.max is not None and report.reference_loss.max is not None
    assert abs(report.loss.max - report.reference_loss.max) < 1e-3 * abs(
        report.reference_loss.max
    )
