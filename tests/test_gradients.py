"""Gradient underflow, gradient overflow at a loss scale, and the loss-scale window."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.config import load_settings
from nan_hunter.findings import Report
from nan_hunter.precision.formats import FP16
from nan_hunter.precision.gradients import FlushStats, GradientLog
from tests.conftest import FIXTURES

UNDERFLOW = FIXTURES / "fx_grad_underflow.py"


def _scan(**options: object) -> Report:
    return scan_file(str(UNDERFLOW), load_settings(overrides=options))


def test_flush_stats_count_vanished_and_subnormal_values() -> None:
    log = GradientLog(FP16)
    exact = torch.tensor([1e-9, 1e-6, 1.0, 0.0])
    rounded = exact.half()
    log.record(exact, rounded)
    record = log.records[rounded]
    assert record.flush == FlushStats(nonzero=3, vanished=1, subnormal=1)
    assert record.flush.lost_share == pytest.approx(2 / 3)
    assert sum(record.histogram) == 3


def test_window_from_a_histogram() -> None:
    """1e-6 (binary exponent -19) needs 2**6 to reach FP16's smallest normal 2**-14; 1.0 must stay
    below 65504, so 2**15 at most; with 100 of 101 values tiny the window is 2**6 .. 2**15."""
    log = GradientLog(FP16)
    exact = torch.tensor([1e-6] * 100 + [1.0])
    rounded = exact.half()
    log.record(exact, rounded)
    params = [log.records[rounded]]
    window = log.window(1.0, 0.25, params)
    assert (window.low, window.high, window.recommended) == (6, 15, 14)
    # the same gradients measured at a loss scale of 16 are 16x smaller in truth
    shifted = log.window(2.0**4, 0.25, params)
    assert (shifted.low, shifted.high) == (10, 19)


def test_no_window_when_range_is_too_wide() -> None:
    log = GradientLog(FP16)
    exact = torch.tensor([1e-12] * 10 + [1e3])
    rounded = exact.half()
    log.record(exact, rounded)
    window = log.window(1.0, 0.25, [log.records[rounded]])
    assert window.empty and window.recommended is None


def test_unscaled_gradients_underflow_with_window_and_advice() -> None:
    report = _scan()
    (finding,) = report.findings
    assert (finding.code, finding.module, finding.phase.value) == ("NH402", "hidden", "backward")
    assert "100% of the nonzero gradient values of hidden.weight, hidden.bias" in finding.message
    window = report.loss_scale
    assert window is not None
    assert (window.low, window.high, window.recommended) == (9, 23, 22)
    assert finding.fix is not None
    assert finding.fix.title == "Use torch.amp.GradScaler(init_scale=2**22)"


def test_recommended_scale_is_clean() -> None:
    report = _scan(grad_scale=2.0**22)
    assert report.status == "clean"


def test_too_large_scale_overflows_with_the_window_to_go_back_to() -> None:
    report = _scan(grad_scale=1e12)
    (finding,) = [f for f in report.findings if f.is_error]
    assert (finding.code, finding.phase.value, finding.kind.value) == (
        "NH401", "backward", "overflow"
    )
    assert finding.module == "out"
    assert "at loss scale 1.00e+12" in finding.message
    assert "use torch.amp.GradScaler(init_scale=2**22)" in finding.message
    assert report.loss_scale is not None and report.loss_scale.current == 1.0


def test_cli_grad_scale() -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["scan", str(UNDERFLOW), "--grad-scale", "4194304"])
    assert ok.exit_code == 0, ok.stdout
    bad = runner.invoke(app, ["scan", str(UNDERFLOW), "--grad-scale", "lots"])
    assert bad.exit_code == 2
    assert "'grad_scale' must be none or a positive number" in bad.stderr
