"""The loss spike rule: a loss above K times the running median of the recent ones."""

from __future__ import annotations

import pytest

from nan_hunter.core.spikes import Spike, SpikeRule, SpikeWatch
from nan_hunter.errors import NanHunterError


def test_a_loss_above_k_times_the_median_is_a_spike_after_the_warmup() -> None:
    watch = SpikeWatch(SpikeRule(factor=10.0, window=5, warmup=3))
    assert watch.observe(1, 100.0) is None  # warm-up: not judged, though 100 is large
    assert watch.observe(2, 3.0) is None
    assert watch.observe(3, 4.0) is None
    spike = watch.observe(4, 41.0)  # median of [100, 3, 4] is 4: 41 > 40
    assert spike == Spike(4, 41.0, 4.0)
    assert spike.line() == "the loss 41 is 10.2x its running median 4"
    assert watch.observe(5, 39.0) is None  # median of [100, 3, 4, 41] is 22.5
    assert (watch.count, watch.first) == (1, spike)


def test_the_median_is_of_the_last_window_losses_only() -> None:
    watch = SpikeWatch(SpikeRule(factor=10.0, window=3, warmup=1))
    for step, loss in enumerate([1000.0, 1000.0, 1.0, 1.0, 1.0], start=1):
        watch.observe(step, loss)
    assert list(watch.recent) == [1.0, 1.0, 1.0]
    assert watch.observe(6, 10.5) == Spike(6, 10.5, 1.0)


def test_non_finite_zero_and_negative_losses_and_medians_are_not_judged() -> None:
    watch = SpikeWatch(SpikeRule(factor=2.0, window=4, warmup=1))
    assert watch.observe(1, float("nan")) is None and watch.seen == 0
    assert watch.observe(2, -1.0) is None
    assert watch.observe(3, -5.0) is None  # median -1: no ratio to it
    assert watch.observe(4, 100.0) is None  # median of [-1, -5] is -3
    assert watch.observe(5, float("inf")) is None
    assert watch.count == 0 and list(watch.recent) == [-1.0, -5.0, 100.0]


@pytest.mark.parametrize(("rule", "message"), [
    ({"factor": 1.0}, "--spike-factor must be a number above 1, got 1"),
    ({"factor": float("inf")}, "--spike-factor must be a number above 1, got inf"),
    ({"window": 0}, "--spike-window and --spike-warmup must be at least 1"),
])
def test_a_rule_that_cannot_work_is_refused(rule: dict[str, float], message: str) -> None:
    with pytest.raises(NanHunterError, match=f"^{message}$".replace("-", r"\-")):
        SpikeRule(**rule)  # type: ignore[arg-type]


def _run_critic(*options: str, spike_at: int = 0) -> tuple[int, str]:
    from typer.testing import CliRunner

    from nan_hunter.cli import app
    from tests.conftest import ROOT

    script = str(ROOT / "tests" / "run_scripts" / "critic_train.py")
    result = CliRunner().invoke(app, ["run", "--no-save-repro", *options, script,
                                      "--spike-at", str(spike_at)])
    return result.exit_code, result.stderr


def test_each_optimizer_has_its_own_median() -> None:
    """Five critic steps (loss ~0.01) per generator step (loss ~1): with one running median
    for both, every generator step was 100x the critic's median, a "spike"."""
    code, stderr = _run_critic()
    assert code == 0, stderr
    assert "running median" not in stderr
    assert "120 optimizer steps checked, no problem" in stderr


def test_a_real_spike_of_one_optimizer_is_named_with_it() -> None:
    code, stderr = _run_critic("--spikes-are-problems")
    assert code == 0 and "running median" not in stderr
    code, stderr = _run_critic(spike_at=15)
    assert code == 0, stderr
    (line,) = [ln for ln in stderr.splitlines() if "running median" in ln]
    assert line.startswith("nan-hunter: warning: training step 90: optimizer 2 (SGD): the loss ")
