"""Gradient underflow, gradient overflow at a loss scale, and the loss-scale window."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import nan_hunter
from nan_hunter.api import scan_file
from nan_hunter.cli import app
from nan_hunter.engine import scan as engine
from nan_hunter.findings import Report
from nan_hunter.precision.formats import FP16
from nan_hunter.precision.gradients import FlushStats, GradientLog
from nan_hunter.precision.loss_scale import largest_finite
from nan_hunter.project.config import load_settings
from nan_hunter.report import render
from tests.conftest import FIXTURES, marker_line, scanned

UNDERFLOW = FIXTURES / "fx_grad_underflow.py"
BOUNDARY = FIXTURES / "fx_loss_weight_underflow.py"


def _scan(**options: object) -> Report:
    return scanned(UNDERFLOW, **options)


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
    report = _scan(grad_scale="none")
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
    for scale, header in [
        ("4194304", "loss scale 2**22)"),
        ("2**22", "loss scale 2**22)"),
        ("dynamic", "GradScaler 2**16, dynamic)"),
        ("none", "no loss scaling)"),
    ]:
        ok = runner.invoke(app, ["scan", str(UNDERFLOW), "--grad-scale", scale, "--exit-zero"])
        assert ok.exit_code == 0, ok.stderr
        assert ok.stdout.splitlines()[0].endswith(header), ok.stdout
    bad = runner.invoke(app, ["scan", str(UNDERFLOW), "--grad-scale", "lots"])
    assert bad.exit_code == 2
    assert "'grad_scale' must be none, dynamic or a positive number (65536, 2**16)" in bad.stderr


def test_default_models_gradscaler_and_says_so() -> None:
    """GradScaler's default 2**16 lies in this model's window (2**9 .. 2**23): clean."""
    report = _scan()
    assert report.status == "clean"
    scaling = report.target.loss_scaling
    assert scaling is not None
    assert (scaling.policy, scaling.initial, scaling.used, scaling.skipped) == (
        "dynamic", 2.0**16, 2.0**16, 0
    )
    assert render(report).splitlines()[0].endswith(
        "(policy cuda, GradScaler 2**16, dynamic)"
    )
    data = json.loads(render(report, "json"))
    assert data["target"]["loss_scaling"] == {
        "policy": "dynamic", "initial": 65536.0, "used": 65536.0, "skipped_steps": 0
    }


def test_dynamic_scale_backs_off_as_gradscaler_does() -> None:
    """A sum loss makes gradients of ~1e2: 2**16 overflows, GradScaler skips steps and halves
    its scale until they fit (2**9: 1e2 * 512 < 65504): no error, the back-off is reported."""

    class SumLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    torch.manual_seed(0)
    model, batch = SumLoss(), torch.randn(64, 16)

    def loss_fn(out: torch.Tensor, _: object) -> torch.Tensor:
        return out.float().pow(2).sum()

    fixed = nan_hunter.scan(model, batch, loss_fn, grad_scale=2**16)
    assert [f.code for f in fixed.findings if f.is_error] == ["NH401"]
    dynamic = nan_hunter.scan(model, batch, loss_fn)
    assert dynamic.errors == 0, [f.message for f in dynamic.findings]
    scaling = dynamic.target.loss_scaling
    assert scaling is not None and scaling.policy == "dynamic"
    assert scaling.used < 2.0**16 and scaling.initial == 2.0**16
    assert scaling.used == 2.0**16 / 2**scaling.skipped
    window = fixed.loss_scale
    assert window is not None and window.high is not None
    assert scaling.used <= 2.0**window.high + 1  # settles inside the window's overflow bound
    assert f"backed off to 2**{round(math.log2(scaling.used))} after {scaling.skipped}" in (
        render(dynamic).splitlines()[0]
    )


def test_loss_weight_underflow_at_the_cast_boundary() -> None:
    """A 1e-6 loss weight: the gradient is lost at the FP32 -> FP16 cast of the loss's input,
    before any parameter gradient exists; reported at the loss line, with the window."""
    report = scanned(BOUNDARY)
    first = report.findings[0]
    assert (first.code, first.phase.value, first.op) == (
        "NH402", "backward", "torch.nn.functional.mse_loss"
    )
    assert first.location is not None
    assert first.location.line == marker_line(BOUNDARY, "# <- culprit")
    assert first.modules == ("out",)
    assert "are lost at the FP32 -> float16 cast at loss scale 2**16" in first.message
    window = report.loss_scale
    assert window is not None and window.low is not None and window.recommended is not None
    assert window.low > 16  # GradScaler's default is too small for this loss
    assert first.fix is not None
    assert first.fix.title == f"Use torch.amp.GradScaler(init_scale=2**{window.recommended})"
    # at the recommended scale the boundary keeps its gradient
    kept = scan_file(
        str(BOUNDARY), load_settings(overrides={"grad_scale": 2.0**window.recommended})
    )
    assert "NH402" not in {f.code for f in kept.findings}, [f.message for f in kept.findings]
    # unscaled, every value vanishes at the cast
    unscaled = scan_file(str(BOUNDARY), load_settings(overrides={"grad_scale": "none"}))
    assert "(16384 vanish, 0 go subnormal, of 16384)" in unscaled.findings[0].message


class _Stack(nn.Module):
    """Three layers built by one loop: their NH402 warnings share a source line."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(3))
        self.head = nn.Linear(32, 512)
        with torch.no_grad():
            self.head.weight.mul_(1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def test_identical_warnings_are_one_finding_listing_the_modules() -> None:
    torch.manual_seed(0)
    report = nan_hunter.scan(_Stack(), torch.randn(64, 32), grad_scale="none")
    grouped = [f for f in report.findings if f.code == "NH402" and len(f.modules) > 1]
    (finding,) = grouped
    assert finding.modules == ("layers.0", "layers.1", "layers.2")
    assert finding.module == "layers.0"
    assert "of the parameters of 3 modules at this line (layers.0, layers.1, layers.2)" in (
        finding.message
    )
    data = json.loads(render(report, "json"))
    (entry,) = [f for f in data["findings"] if len(f["modules"]) > 1]
    assert entry["modules"] == ["layers.0", "layers.1", "layers.2"]
    assert entry["module"] == "layers.0"  # the fields of today stay


@pytest.mark.parametrize(("options", "policy"), [
    ({"dtype": "bfloat16"}, "none"),
    ({"mode": "half"}, "none"),
    ({"dtype": "bfloat16", "grad_scale": 1024}, "fixed"),
    ({"backward": False}, None),
])
def test_no_gradscaler_where_training_would_not_use_one(
    options: dict[str, object], policy: str | None
) -> None:
    """BF16 and model.half() train without a GradScaler unless a scale is asked for; without a
    backward there is no loss scaling to speak of."""
    report = _scan(**options)
    scaling = report.target.loss_scaling
    assert (scaling.policy if scaling else None) == policy


def test_window_equals_the_share_of_every_parameter_checked_one_by_one() -> None:
    """``window`` takes the largest lost share per scale; the definition checks each one."""
    import itertools
    import math
    import random

    from nan_hunter.precision.exponents import EXP_OFFSET, lost_share
    from nan_hunter.precision.gradients import GradRecord

    rng = random.Random(0)
    log = GradientLog(FP16)
    log.record(torch.tensor([1e-3, 2.0]), torch.tensor([1e-3, 2.0]).half())
    limit = math.log2(FP16.smallest_normal)
    for trial in range(20):
        records = []
        for _ in range(rng.randint(0, 6)):
            histogram = [0] * 300
            for _ in range(rng.randint(0, 40)):
                histogram[rng.randint(EXP_OFFSET - 60, EXP_OFFSET + 10)] += rng.randint(1, 9)
            records.append(GradRecord(FlushStats(0, 0, 0), tuple(histogram)))
        scale, share = 2.0 ** rng.randint(-3, 20), rng.choice([0.0, 0.05, 0.25, 0.9])
        window = log.window(scale, share, records)
        cumulative = [list(itertools.accumulate(r.histogram)) for r in records]
        expected = [
            k for k in range(-40, 41)
            if log.max_abs / scale * 2.0**k <= FP16.max
            and all(lost_share(c, k - math.log2(scale), limit) <= share for c in cumulative)
        ]  # fmt: skip
        assert window.high == (max(expected) if expected else None), trial
        if expected:
            low = min(expected) if cumulative and min(expected) > -40 else None
            assert window.low == low, trial


class _Mixer(nn.Module):
    """Linear layers around an attention-like product and a GELU: backward nodes that feed a
    parameter (the linears) and nodes that do not (the product, the GELU, the scaling)."""

    def __init__(self, through_add: bool = False) -> None:
        super().__init__()
        self.inner = nn.Linear(16, 16)
        self.outer = nn.Linear(16, 16)
        self.through_add = through_add

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.inner(x))
        mixed = (h @ h.transpose(-1, -2) / 4.0) @ h
        if self.through_add:  # no bias: the matmul's node feeds no parameter it can see
            return torch.nn.functional.linear(mixed, self.outer.weight + 0.0)
        return self.outer(mixed)


def _low_pass(
    model: nn.Module, log: GradientLog, mode: str = "autocast"
) -> tuple[dict[str, object], int]:
    """The per-parameter records of one emulated FP16 pass, and how many forwards it took."""
    from nan_hunter.core.batch import Batch
    from nan_hunter.engine import runner
    from nan_hunter.precision.context import PrecisionPlan

    torch.manual_seed(1)
    batch = torch.randn(16, 16) * 1e-3  # activations and their gradients: 16 x 16 too
    plan = PrecisionPlan(mode=mode, policy="cuda", device="cpu", fmt=FP16, emulate=True)
    with runner.PassRunner(
        model, lambda: Batch((batch,), {}, batch), None, FP16, plan.low_precision,
        plan.numerics, backward=True, half=mode == "half",
    ) as passes:  # fmt: skip
        return dict(passes.run(1.0, log).param_grads), passes.forwards


def test_only_gradients_rounded_where_a_parameter_is_fed_get_a_histogram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The product, the GELU and the scaling round gradients of a parameter's size (16 x 16)
    that no parameter receives: they are measured (their maximum) but not histogrammed. Every
    parameter's record is the one a log that histograms everything gives."""
    from nan_hunter.precision import gradients

    made: list[int] = []
    fill_row = gradients.fill_row

    def counted(dest: torch.Tensor, exact: torch.Tensor, rounded: torch.Tensor) -> None:
        made.append(exact.numel())
        fill_row(dest, exact, rounded)

    monkeypatch.setattr(gradients, "fill_row", counted)
    torch.manual_seed(0)
    model = _Mixer()
    every = GradientLog(FP16, depth=1)  # the careful rerun's log: every parameter-sized one
    exhaustive, _ = _low_pass(model, every)
    histograms_everywhere = len(made)
    made.clear()
    selective, forwards = _low_pass(model, GradientLog(FP16))
    assert forwards == 1
    assert selective == exhaustive and set(selective) == {
        "inner.weight", "inner.bias", "outer.weight", "outer.bias",
    }  # fmt: skip
    assert 0 < len(made) <= histograms_everywhere - 3, (made, histograms_everywhere)


def test_a_parameter_gradient_rounded_out_of_sight_reruns_the_pass_with_every_histogram() -> None:
    """In half mode ``weight + 0.0`` is an FP16 add whose ``AddBackward`` hands the gradient to
    the parameter unchanged, a node ``feeds_parameter`` does not look through: the matmul that
    rounded it skipped the histogram, the parameter's record is asked for, and the pass runs
    again measuring every gradient of a parameter's size (its statistics still batched). The
    records are those of the careful log. Under autocast the add runs in FP32, whose backward
    hands records on, and nothing runs again."""
    torch.manual_seed(0)
    model = _Mixer(through_add=True)
    careful, _ = _low_pass(model, GradientLog(FP16, depth=1), "half")
    log = GradientLog(FP16)
    records, forwards = _low_pass(model, log, "half")
    assert forwards == 2
    assert records == careful and "outer.weight" in records
    assert log._depth > 1  # still read back in batches: only the histograms changed

    careful, _ = _low_pass(model, GradientLog(FP16, depth=1))
    records, forwards = _low_pass(model, GradientLog(FP16))
    assert forwards == 1
    assert records == careful and "outer.weight" in records


def test_a_transposed_gradient_is_histogrammed_without_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transposed gradient and its rounding share a layout: the row is filled from their
    storage in place (no ``reshape`` copy), with the counts of the contiguous gradient."""
    from nan_hunter.precision.exponents import ROW, fill_row

    exact = torch.randn(300, 200) * torch.logspace(-12, 2, 200)
    exact[::7] = 0.0
    contiguous = torch.empty(ROW, dtype=torch.int64)
    fill_row(contiguous, exact, exact.half())
    transposed = torch.empty(ROW, dtype=torch.int64)

    def no_copy(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("reshaped: a copy")

    t = exact.t()
    rounded = t.half()
    assert rounded.stride() == t.stride() and not t.is_contiguous()
    monkeypatch.setattr(torch.Tensor, "reshape", no_copy)
    fill_row(transposed, t, rounded)
    monkeypatch.undo()
    assert torch.equal(transposed, contiguous)
    assert int(contiguous[0]) == len(range(0, 300, 7)) * 200  # the zeros, bucket 0


SETTLES = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 64)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc(x))).sum()


def build_model():
    torch.manual_seed(0)
    return Net()


def sample_batch():
    torch.manual_seed(0)
    return torch.randn(32, 64)
"""
"""An FP16 sum whose gradients reach |g| = 32: finite up to 2**10, overflowing from 2**11."""


def test_gradscaler_settles_where_its_step_is_finite_not_at_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the step at the backed-off scale still overflows (the window's measurement missed
    a gradient: here, back_off told to trust 2**15) but the unscaled one is finite, GradScaler
    stops at the first finite scale, 2**10, inside the window; not "2**0 after 16 skipped
    steps" above a window of 2**-12 .. 2**10."""
    path = tmp_path / "model.py"
    path.write_text(SETTLES)
    honest = scan_file(str(path))
    scaling, window = honest.target.loss_scaling, honest.loss_scale
    assert scaling is not None and window is not None
    assert (scaling.used, scaling.skipped, window.high) == (2.0**10, 6, 10)

    monkeypatch.setattr(engine, "back_off", lambda *_: (2.0**15, 1))
    report = scan_file(str(path))
    assert report.status == "clean", [f.message for f in report.findings]
    scaling, window = report.target.loss_scaling, report.loss_scale
    assert scaling is not None and window is not None
    assert (scaling.used, scaling.skipped, window.high) == (2.0**10, 6, 10)
    assert render(report).splitlines()[0].endswith(
        "(policy cuda, GradScaler 2**16, dynamic, backed off to 2**10 after 6 skipped steps)"
    )


def test_largest_finite_scale_halves_the_exponent_range() -> None:
    asked: list[float] = []

    def finite(scale: float) -> bool:
        asked.append(scale)
        return scale <= 2.0**10

    assert largest_finite(2.0**15, finite) == 2.0**10
    assert asked == [2.0**7, 2.0**11, 2.0**9, 2.0**10]
    assert largest_finite(2.0**15, lambda s: False) == 1.0
    assert largest_finite(2.0**1, finite) == 1.0
