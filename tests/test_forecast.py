"""``nan-hunter run``'s forecast (issue 37): the range map sampled every N optimizer steps, the
trend of each module's max |x|, the warning when it reaches FP16's limit within the run, and
``--stop-before-overflow``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.training.forecast import (
    MIN_SAMPLES,
    Forecast,
    RangeSample,
    RangeSampler,
    within,
)
from tests.conftest import ROOT

GROWING = ROOT / "tests" / "run_scripts" / "growing_gain_train.py"
SCHEMA = ROOT / "nan_hunter" / "report" / "report.schema.json"
runner = CliRunner()


def _doubling(forecast: Forecast, module: str, start: float, every: int, steps: range) -> None:
    for step in steps:
        forecast.add(RangeSample(step, {module: start * 2 ** (step / every)}, {}, {}))


# --- the trend --------------------------------------------------------------------------------


def test_a_steady_doubling_is_forecast_at_the_step_it_reaches_the_limit() -> None:
    """max |x| = 2**(step / 25): 65504 = 2**15.999 is reached at step 399.97."""
    forecast = Forecast(65504.0, "float16")
    _doubling(forecast, "head.proj", 1.0, 25, range(10, 110, 10))
    (trend,) = forecast.trends()
    assert trend.module == "head.proj"
    assert trend.doubling_steps == pytest.approx(25.0)
    assert trend.overflow_step == 400
    assert trend.steps == (30, 40, 50, 60, 70, 80, 90, 100)  # the last 8 samples
    assert trend.line() == (
        "head.proj doubles every ~25 steps (max |x| 16 at step 100): at this rate it overflows "
        "float16 around step 400"
    )


def test_no_forecast_for_too_few_samples_a_flat_or_falling_or_noisy_series() -> None:
    forecast = Forecast(65504.0, "float16")
    _doubling(forecast, "few", 1.0, 25, range(10, 10 * MIN_SAMPLES, 10))
    for step, value in zip(range(10, 90, 10), (4, 4, 4, 4, 4, 4, 4, 4), strict=True):
        forecast.add(RangeSample(step, {"flat": float(value)}, {}, {}))
    for step, value in zip(range(10, 90, 10), (9, 8, 7, 6, 5, 4, 3, 2), strict=True):
        forecast.add(RangeSample(step, {"falling": float(value)}, {}, {}))
    for step, value in zip(range(10, 90, 10), (1, 50, 2, 40, 3, 60, 2, 70), strict=True):
        forecast.add(RangeSample(step, {"noisy": float(value)}, {}, {}))
    assert forecast.trends() == []


def test_a_forecast_counts_within_the_run_or_ten_times_the_steps_so_far() -> None:
    forecast = Forecast(65504.0, "float16")
    _doubling(forecast, "m", 1.0, 25, range(10, 110, 10))
    (trend,) = forecast.trends()  # overflow around step 400
    assert within(trend, 100, max_steps=500) and not within(trend, 100, max_steps=300)
    assert within(trend, 40, max_steps=None) and not within(trend, 39, max_steps=None)


# --- the sampler --------------------------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.inp(x)) * 3.0)


def test_the_sampler_reads_each_modules_max_inputs_gradients_and_removes_its_hooks() -> None:
    torch.manual_seed(0)
    net = _Net()
    x = torch.randn(5, 4)
    sampler = RangeSampler(tiny=6.1e-5)
    sampler.attach(net)
    y = net(x)
    sampler.detach()
    assert all(not m._forward_hooks for m in net.modules())
    y.sum().backward()
    sample = sampler.collect(7)
    assert sample is not None and sample.step == 7
    with torch.no_grad():
        hidden = torch.relu(net.inp(x)) * 3.0
        assert sample.forward["inp"] == pytest.approx(float(net.inp(x).abs().max()))
    assert sample.forward["out (input)"] == pytest.approx(float(hidden.abs().max()))
    assert sample.forward["(root)"] == pytest.approx(float(y.detach().abs().max()))
    assert sample.backward["(root)"] == 1.0  # d(sum)/dy
    assert sample.backward["out"] == 1.0
    assert sample.tiny == {}  # FP32 outputs: no low-precision share
    assert not sampler.pending and sampler.collect(8) is None


def test_the_sampler_counts_values_below_the_smallest_normal_in_fp16_outputs() -> None:
    class Half(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.half()

    sampler = RangeSampler(tiny=6.1e-5)
    module = Half()
    sampler.attach(module)
    module(torch.tensor([1e-6, 2e-6, 1.0, 0.0]))
    sample = sampler.collect(1)
    assert sample is not None
    assert sample.tiny["(root)"] == pytest.approx(2 / 3)  # of the three nonzero values


# --- through nan-hunter run -----------------------------------------------------------------------


def _run(tmp_path: Path, *options: str) -> tuple[int, str, dict]:
    report = tmp_path / "report.json"
    result = runner.invoke(
        app, ["run", "--no-save-repro", "--format", "json", "-o", str(report), *options,
              str(GROWING)], env={"COLUMNS": "200"},
    )
    data = json.loads(report.read_text()) if report.exists() else {}
    return result.exit_code, result.stderr, data


def test_run_warns_of_the_overflow_long_before_it_and_reports_the_trend(tmp_path: Path) -> None:
    """The hidden activations double every ~12 steps; FP16 overflows at step 158. The warning
    comes at step 21 (the fourth sample) and says step 157; the report's trend, fitted on the
    samples up to step 156, says 158."""
    code, stderr, data = _run(tmp_path, "--forecast-every", "5")
    assert code == 1
    warnings = [ln for ln in stderr.splitlines() if "overflow" in ln and "warning:" in ln]
    assert warnings == [
        "nan-hunter: warning: training step 21: out (input) doubles every ~12 steps (max |x| "
        "24.2 at step 21): at this rate it overflows float16 around step 157"
    ]
    training = data["training"]
    assert (training["problem_step"], training["samples"]) == (158, 31)
    first = training["forecast"][0]
    assert first["module"] == "out (input)"
    assert first["steps"] == list(range(121, 157, 5))
    assert first["overflow_step"] == 158
    assert first["doubling_steps"] == pytest.approx(12.3, abs=0.2)
    assert "; forecast: out (input) doubles every ~12 steps" in stderr
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))


def test_stop_before_overflow_stops_while_every_value_is_finite(tmp_path: Path) -> None:
    code, stderr, data = _run(tmp_path, "--forecast-every", "5", "--stop-before-overflow")
    assert code == 1
    training = data["training"]
    assert (training["problem_step"], training["steps_checked"]) == (156, 155)
    assert training["verdict"] == "overflow_forecast"
    assert training["evidence"][0] == (
        "no value was non-finite yet: the sampled range map's trend reaches the format's "
        "limit before the next sample"
    )
    assert not [f for f in data["findings"] if f["severity"] == "error"]
    assert "nan-hunter: training step 156: out (input) doubles every ~12 steps" in stderr
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))


def test_forecast_off_samples_nothing_and_stop_before_overflow_needs_it(tmp_path: Path) -> None:
    code, stderr, data = _run(tmp_path, "--forecast-every", "0", "--max-steps", "60")
    assert code == 0 and "doubles every" not in stderr
    assert "samples" not in data["training"] and "forecast" not in data["training"]
    result = runner.invoke(app, ["run", "--forecast-every", "0", "--stop-before-overflow",
                                 str(GROWING)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "nan-hunter: error: --stop-before-overflow needs the forecast (--forecast-every above 0)"
    )


def test_the_html_report_draws_the_trend(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    result = runner.invoke(app, ["run", "--no-save-repro", "--forecast-every", "5", "--format",
                                 "html", "-o", str(page), str(GROWING)])
    assert result.exit_code == 1
    text = page.read_text()
    assert '<section id="forecast"><h2>Forecast</h2>' in text
    assert '<svg id="forecast-0"' in text and "<title>overflow around step 158</title>" in text
    assert math.isfinite(float(text.split("overflows float16 around step ")[1].split(".")[0]))
