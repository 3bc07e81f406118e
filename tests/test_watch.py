"""``nan_hunter.watch``: the per-step check of a training loop, and ``run_steps``."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter.errors import ConfigError, NanHunterError
from nan_hunter.project.config import Settings, load_settings
from nan_hunter.project.loader import import_user_module, load_target
from nan_hunter.training import (
    Reason,
    TrainingProblem,
    Watcher,
    WatchEvent,
    finite_flag,
    run_steps,
    watch,
)
from nan_hunter.training.rerun import reaches_parameters
from nan_hunter.training.watcher import REPLACED_MODEL
from tests.conftest import EXAMPLES, marker_line

EXAMPLE = EXAMPLES / "training_loop_watch.py"
CULPRIT = "grow with the weights"
FIRST_BAD_WITH_SCALER = 11
"""0-based step at which the example's loss first goes NaN, with GradScaler (6 skips before)."""
FIRST_BAD_WITHOUT_SCALER = 6


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return import_user_module(str(EXAMPLE))


@pytest.fixture(scope="module")
def watched(example: ModuleType) -> Watcher:
    _, w = example.train()
    return w


def _first_bad_step(example: ModuleType, *, scaler: bool, steps: int = 20) -> int | None:
    """The example's loop without a watcher: the first step whose loss is not finite."""
    model, batch = example.build_model(), example.sample_batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=example.LR)
    grad_scaler = torch.amp.GradScaler("cpu", enabled=scaler)
    for step in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = example.loss_fn(model(batch), batch)
        if not torch.isfinite(loss):
            return step
        grad_scaler.scale(loss).backward()
        grad_scaler.step(optimizer)
        grad_scaler.update()
        optimizer.zero_grad()
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8)


def _snapshot(model: nn.Module) -> dict[str, Any]:
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in
                  model.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": [m.training for m in model.modules()],
        "devices": {n: p.device for n, p in model.named_parameters()},
    }


def _assert_identical(model: nn.Module, before: dict[str, Any]) -> None:
    after = _snapshot(model)
    assert after["state"].keys() == before["state"].keys()
    for name, value in before["state"].items():
        assert value.dtype == after["state"][name].dtype, name
        assert torch.equal(_bits(value), _bits(after["state"][name])), name
    for name, grad in before["grads"].items():
        other = after["grads"][name]
        assert (grad is None) == (other is None), name
        if grad is not None:
            assert torch.equal(_bits(grad), _bits(other)), name
    for key in ("requires_grad", "training", "devices"):
        assert after[key] == before[key], key


# --------------------------------------------------------------------------- the example


def test_example_nan_is_caught_at_the_exact_step(example: ModuleType, watched: Watcher) -> None:
    truth = _first_bad_step(example, scaler=True)
    assert truth == FIRST_BAD_WITH_SCALER
    assert [e.step for e in watched.reports] == [truth]
    assert watched.stopped
    assert watched.steps == truth + 1
    event = watched.reports[0]
    assert event.reason is Reason.LOSS
    assert event.pre_step  # the scaler skipped the step: the weights are the step's own
    assert event.scale == 2048.0
    assert event.report is not None
    first = event.report.findings[0]
    assert first.code == "NH102"
    assert first.op == "Tensor.__matmul__"
    assert first.location is not None
    assert first.location.line == marker_line(EXAMPLE, CULPRIT)
    assert first.fp32_rerun is not None and first.fp32_rerun.finite


def test_example_gradscaler_skips_on_the_way_are_not_reported(watched: Watcher) -> None:
    # Steps 0, 2, 3, 5 and 7 are skipped by the scaler backing off (and 11 is the NaN step):
    # none of them is a problem, never three in a row after the scale settled.
    assert watched.skipped == 6
    assert watched.problems == 1


def test_example_without_scaler_is_caught_and_its_update_skipped(
    example: ModuleType,
) -> None:
    truth = _first_bad_step(example, scaler=False)
    assert truth == FIRST_BAD_WITHOUT_SCALER
    model, w = example.train(scaler=False)
    assert [e.step for e in w.reports] == [truth]
    event = w.reports[0]
    assert event.reason is Reason.LOSS
    assert event.scale is None
    # The optimizer pre-hook saw the NaN gradients, copied the model and set the gradients
    # aside, so Adam wrote nothing: the weights a stopped run saves are finite (before, "stop"
    # let the NaN update through), and the re-run sees the step's own weights.
    assert event.pre_step
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert event.report is not None
    first = event.report.findings[0]
    assert (first.code, first.op) == ("NH102", "Tensor.__matmul__")
    assert first.location is not None and first.location.line == marker_line(EXAMPLE, CULPRIT)


def test_report_mode_scans_once_and_counts_the_rest(example: ModuleType) -> None:
    _, w = example.train(steps=15, on_problem="report")
    assert not w.stopped
    assert w.steps == 15
    assert [e.step for e in w.reports] == [FIRST_BAD_WITH_SCALER]
    assert w.problems == 15 - FIRST_BAD_WITH_SCALER  # the forward overflows every later step


def test_raise_mode_raises_training_problem(example: ModuleType) -> None:
    with pytest.raises(TrainingProblem) as caught:
        example.train(on_problem="raise")
    problem = caught.value
    assert isinstance(problem, NanHunterError)
    assert problem.event.step == FIRST_BAD_WITH_SCALER
    assert problem.event.report is not None
    assert f"training step {FIRST_BAD_WITH_SCALER}" in str(problem)
    assert "NH102" in str(problem)


def test_example_main_prints_the_step_and_the_report(
    example: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert example.main() == 0
    out = capsys.readouterr().out
    assert f"step {FIRST_BAD_WITH_SCALER}: the loss is nan" in out
    assert "error[NH102]" in out
    assert f"training_loop_watch.py:{marker_line(EXAMPLE, CULPRIT)}" in out


# --------------------------------------------------------------------------- no false alarms


def _regression(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, torch.randn(64, 16), torch.randn(64, 4)


def _train(
    model: nn.Module,
    x: torch.Tensor,
    loss_of: Any,
    w: Watcher,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    steps: int,
) -> None:
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_of(model(x), x)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        w.step(x, loss)
        optimizer.zero_grad()


@pytest.mark.parametrize("use_scaler", [True, False])
def test_clean_model_never_triggers(use_scaler: bool) -> None:
    model, x, y = _regression()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)

    def loss_of(out: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return (out.float() - y).pow(2).mean()

    with watch(model, optimizer, scaler, loss_fn=loss_of, on_problem="raise") as w:
        _train(model, x, loss_of, w, optimizer, scaler, steps=10)
    assert (w.steps, w.problems, w.reports, w.stopped) == (10, 0, [], False)


def test_initial_gradscaler_back_off_is_not_reported() -> None:
    # The summed loss makes the scaled gradients overflow FP16 at 65536 down to 512: the scaler
    # skips the first 8 steps while it backs off, then trains normally.
    model, x, y = _regression()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")

    def loss_of(out: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return (out.float() - y).pow(2).sum() * 4

    with watch(model, optimizer, scaler, loss_fn=loss_of, on_problem="raise") as w:
        _train(model, x, loss_of, w, optimizer, scaler, steps=12)
    assert w.skipped == 8
    assert scaler.get_scale() == 256.0
    assert (w.problems, w.reports) == (0, [])


# --------------------------------------------------------------------------- scaler trouble


class RootOfZero(nn.Module):
    """Fine forward; once ``broken`` is set, the backward of sqrt at 0 is inf * 0 = NaN, at any
    loss scale (a real bug that GradScaler can only answer by shrinking its scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.broken = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.broken:
            h = h + torch.sqrt(torch.zeros_like(h) * self.fc.weight.sum())
        return h


def _root_loss(out: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return out.float().pow(2).mean()


def test_collapsing_scale_is_reported() -> None:
    torch.manual_seed(0)
    model, x = RootOfZero(), torch.randn(4, 8)
    model.broken = True
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    with watch(model, optimizer, scaler, loss_fn=_root_loss, on_problem="stop") as w:
        for _ in range(20):
            _train(model, x, _root_loss, w, optimizer, scaler, steps=1)
            if w.stopped:
                break
    # 64 -> 32 -> ... -> 0.5: the 7th skip (step 6) takes the scale below scale_floor 1.0.
    # Never settled, so the skips before it are the initial back-off, not a streak.
    assert [e.step for e in w.reports] == [6]
    event = w.reports[0]
    assert event.reason is Reason.SCALE_COLLAPSE
    assert event.scale == 1.0  # the scale step 6 ran with
    assert event.pre_step
    assert "below scale_floor 1" in event.detail
    assert event.report is not None


@pytest.mark.parametrize("patience", [2, 3])
def test_skips_in_a_row_after_settling_are_reported(patience: int) -> None:
    torch.manual_seed(0)
    model, x = RootOfZero(), torch.randn(4, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with watch(model, optimizer, scaler, loss_fn=_root_loss, skip_patience=patience) as w:
        _train(model, x, _root_loss, w, optimizer, scaler, steps=3)  # settles
        assert (w.skipped, w.problems) == (0, 0)
        model.broken = True
        _train(model, x, _root_loss, w, optimizer, scaler, steps=5)
    assert [e.step for e in w.reports] == [3 + patience - 1]
    assert w.reports[0].reason is Reason.SKIPPED
    assert f"skipped {patience} steps in a row" in w.reports[0].detail
    assert w.problems == 1  # once per streak


# --------------------------------------------------------------------------- hygiene


def test_hooks_are_removed_after_the_context() -> None:
    model, x, _ = _regression()
    optimizer = torch.optim.Adam(model.parameters())
    assert not optimizer._optimizer_step_pre_hooks
    with watch(model, optimizer) as w:
        assert len(optimizer._optimizer_step_pre_hooks) == 1
        w.step(x, model(x).sum())
    assert not optimizer._optimizer_step_pre_hooks
    with pytest.raises(RuntimeError, match="boom"), watch(model, optimizer):
        assert len(optimizer._optimizer_step_pre_hooks) == 1
        raise RuntimeError("boom")
    assert not optimizer._optimizer_step_pre_hooks


def test_hooks_are_removed_when_the_watcher_raises(example: ModuleType) -> None:
    model, batch = example.build_model(), example.sample_batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=example.LR)
    with pytest.raises(TrainingProblem), watch(
        model, optimizer, loss_fn=example.loss_fn, on_problem="raise"
    ) as w:
        for _ in range(20):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = example.loss_fn(model(batch), batch)
            loss.backward()
            optimizer.step()
            w.step(batch, loss)
            optimizer.zero_grad()
    assert not optimizer._optimizer_step_pre_hooks


def _attention() -> tuple[nn.Module, torch.Tensor]:
    module = import_user_module(str(EXAMPLES / "attention_unscaled.py"))
    return module.build_model(), module.sample_batch()


def test_users_model_is_bit_identical_after_a_watched_rerun() -> None:
    model, batch = _attention()
    model.eval()  # an unusual flag, to see that it survives
    model.q_proj.bias.requires_grad_(False)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(batch).float().mean()
    loss.backward()  # NaN gradients, kept in .grad as a user's loop would
    before = _snapshot(model)
    with watch(model) as w:
        event = w.step(batch, loss)
    assert isinstance(event, WatchEvent)
    assert event.reason is Reason.LOSS
    assert not event.pre_step  # no optimizer, no scaler: the current weights
    assert event.report is not None and event.report.findings[0].code == "NH102"
    _assert_identical(model, before)


def test_gradient_check_without_loss_and_callable_form() -> None:
    model, x, _ = _regression()
    model(x).sum().backward()
    w = watch(model)  # usable without `with` (no hook to install)
    assert w(x) is None
    model[0].weight.grad[0, 0] = float("inf")
    event = w(x)
    assert event is not None and event.reason is Reason.GRADIENT
    assert "0.weight" in event.detail
    assert event.report is not None


def test_no_batch_means_no_scan_but_the_problem_is_recorded() -> None:
    model, _, _ = _regression()
    w = watch(model)
    event = w.step(None, torch.tensor(float("nan")))
    assert event is not None and event.report is None
    assert "not scanned: w.step() was given no batch" in event.detail
    assert w.reports == [event] and w.problems == 1


class Uncopyable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def __deepcopy__(self, memo: dict[int, Any]) -> Uncopyable:
        raise TypeError("cannot pickle '_thread.lock' object")


def test_a_failed_rerun_does_not_stop_the_loop() -> None:
    model, x = Uncopyable(), torch.randn(2, 4)
    w = watch(model)
    event = w.step(x, torch.tensor(float("inf")))
    assert event is not None and event.report is None
    assert "the model cannot be deep-copied: cannot pickle" in event.detail

    def bad_loss(output: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        raise KeyError("label")

    regression, x, _ = _regression()
    w = watch(regression, loss_fn=bad_loss, on_problem="stop")
    event = w.step(x, torch.tensor(float("nan")))
    assert event is not None and event.report is None
    assert "the re-run failed: the model raised KeyError during loss_fn" in event.detail
    assert w.stopped


def test_hook_verdict_is_only_used_for_the_gradients_it_saw() -> None:
    # w.step before optimizer.step: the hook then fires after w.step, on the gradients w.step
    # already checked; the next w.step must check its own gradients, not reuse that verdict.
    model, x, _ = _regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with watch(model, optimizer) as w:
        model(x).sum().backward()
        assert w.step(x) is None
        optimizer.step()  # the hook: finite
        optimizer.zero_grad()
        model(x).sum().backward()
        model[2].bias.grad[0] = float("nan")
        event = w.step(x)
        assert event is not None and event.reason is Reason.GRADIENT
        assert "2.bias" in event.detail
        assert not event.pre_step


def test_finite_flag_handles_fp16_and_nan() -> None:
    big = torch.full((1000,), 60000.0, dtype=torch.float16)  # 2-norm would overflow FP16
    assert bool(finite_flag([big, torch.zeros(3)]))
    assert not bool(finite_flag([big, torch.tensor([1.0, float("nan")])]))
    assert not bool(finite_flag([torch.tensor([float("-inf")])]))
    assert finite_flag([torch.zeros(0), torch.arange(3)]) is None


def test_bad_arguments_are_config_errors() -> None:
    model, _, _ = _regression()
    with pytest.raises(ConfigError, match="on_problem"):
        watch(model, on_problem="explode")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="skip_patience"):
        watch(model, skip_patience=0)
    with pytest.raises(ConfigError, match=r"nan_hunter.watch\(\): unknown option 'dtyp'"):
        watch(model, dtyp="float16")
    w = watch(model, settings=load_settings(), dtype=torch.bfloat16, ignore=("NH5",))
    assert (w.settings.dtype, w.settings.ignore) == ("bfloat16", ("NH5",))


# --------------------------------------------------------------------------- run_steps


@pytest.fixture
def example_target() -> Iterator[Any]:
    yield load_target(str(EXAMPLE))


@pytest.mark.parametrize(
    ("grad_scale", "expected"),
    [(65536.0, FIRST_BAD_WITH_SCALER), ("dynamic", FIRST_BAD_WITH_SCALER),
     ("none", FIRST_BAD_WITHOUT_SCALER)],
)
def test_run_steps_finds_the_watchers_step_and_leaves_the_model_alone(
    example: ModuleType, example_target: Any, grad_scale: float | None, expected: int
) -> None:
    before = _snapshot(example_target.model)
    settings = load_settings(None, {"device": "cpu", "grad_scale": grad_scale})
    result = run_steps(example_target, settings, 20, lr=example.LR)
    assert result.first_bad_step == expected
    assert result.steps_run == expected + 1
    assert result.reason is Reason.LOSS
    first = result.report.findings[0]
    assert (first.code, first.op) == ("NH102", "Tensor.__matmul__")
    assert first.location is not None and first.location.line == marker_line(EXAMPLE, CULPRIT)
    _assert_identical(example_target.model, before)


def test_run_steps_matches_the_watched_report(example: ModuleType, watched: Watcher) -> None:
    target = load_target(str(EXAMPLE))
    settings = load_settings(None, {"device": "cpu", "grad_scale": 65536.0})
    result = run_steps(target, settings, 20, lr=example.LR)
    event = watched.reports[0]
    assert event.report is not None
    assert result.first_bad_step == event.step
    # Same weights, same batch, same loss scale (2048): the same scan (the watcher's goes
    # through nan_hunter.scan, which also verifies the fixes; run_steps does not).
    assert [dataclasses.replace(f, fix=None) for f in result.report.findings] == [
        dataclasses.replace(f, fix=None) for f in event.report.findings
    ]
    assert result.report.loss_scale == event.report.loss_scale


def test_run_steps_clean_scans_the_final_weights(example: ModuleType) -> None:
    target = load_target(str(EXAMPLE))
    result = run_steps(target, load_settings(None, {"device": "cpu"}), 3)  # lr 1e-3: gentle
    assert (result.steps_run, result.first_bad_step, result.reason) == (3, None, None)
    assert result.report.status == "clean"


@dataclasses.dataclass(frozen=True)
class SettingsWithLr(Settings):
    """Settings once the configuration has an ``lr`` key."""

    lr: float = 1e-3


def test_run_steps_takes_the_learning_rate_from_the_settings(example: ModuleType) -> None:
    target = load_target(str(EXAMPLE))
    result = run_steps(target, SettingsWithLr(device="cpu", lr=example.LR), 20)
    assert result.first_bad_step == FIRST_BAD_WITH_SCALER  # the default: GradScaler, 2**16


def test_run_steps_rejects_bad_arguments(example_target: Any) -> None:
    settings = load_settings(None, {"device": "cpu"})
    with pytest.raises(ConfigError, match="--steps"):
        run_steps(example_target, settings, 0)
    frozen = copy.deepcopy(example_target.model).requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable parameter that gets a gradient"):
        run_steps(dataclasses.replace(example_target, model=frozen), settings, 2)
    half = load_settings(None, {"device": "cpu", "mode": "half", "grad_scale": 1024})
    with pytest.raises(ConfigError, match="mode half"):
        run_steps(example_target, half, 2)


def test_cli_steps_finds_the_step_that_breaks() -> None:
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from nan_hunter.cli import app

    example = Path(__file__).resolve().parents[1] / "examples" / "training_loop_watch.py"
    result = CliRunner().invoke(
        app, ["scan", str(example), "--steps", "20", "--lr", "0.5", "--format", "json"]
    )
    assert result.exit_code == 1, result.stderr
    assert "nan-hunter: trained 12 step(s); step 11 broke" in result.stderr
    first = json.loads(result.stdout)["findings"][0]
    assert (first["code"], first["op"], first["location"]["line"]) == (
        "NH102", "Tensor.__matmul__", 49
    )
    clean = CliRunner().invoke(app, ["scan", str(example), "--steps", "3"])
    assert clean.exit_code == 0
    assert "no step broke" in clean.stderr
    refused = CliRunner().invoke(app, ["scan", str(example), "--steps", "3", "--fix"])
    assert refused.exit_code == 2
    assert "--steps cannot be combined with --fix" in refused.stderr


def test_watch_is_importable_as_users_import_it() -> None:
    """``from nan_hunter import watch`` is the function (checked in a fresh interpreter: once
    any code imported the old ``nan_hunter.watch`` module, Python binds that name to it); the
    old module still exports everything and, sharing the function's name, is callable as it."""
    import subprocess
    import sys

    fresh = subprocess.run(
        [sys.executable, "-c",
         "import nan_hunter.training as t\n"
         "from nan_hunter import watch\n"
         "assert watch is t.watch, watch\n"],
        capture_output=True, text=True, timeout=120,
    )
    assert fresh.returncode == 0, fresh.stderr
    import nan_hunter.training as training
    import nan_hunter.watch as old
    from nan_hunter.watch import Watcher as OldWatcher
    from nan_hunter.watch import watch as old_watch

    assert old_watch is training.watch and OldWatcher is training.Watcher
    model = nn.Linear(2, 2)
    assert isinstance(old(model), training.Watcher)
    assert isinstance(nan_hunter.watch(model), training.Watcher)  # module or function


def test_one_option_normaliser_for_scan_and_watch() -> None:
    """``scan`` and ``watch`` take options the same way: dtypes, sets of codes, bad names."""
    model = nn.Linear(2, 2)
    w = watch(model, dtype=torch.bfloat16, ignore={"NH5", "NH4"}, grad_scale="2**10")
    assert (w.settings.dtype, w.settings.ignore, w.settings.grad_scale) == (
        "bfloat16", ("NH4", "NH5"), 1024.0
    )
    assert w.settings.sources["dtype"] == "api"
    for call in (nan_hunter.scan, watch):
        with pytest.raises(ConfigError, match=r"unknown option 'dtyp'"):
            call(model, torch.ones(1, 2), dtyp="float16")  # type: ignore[operator]


def _clipped_loop(unscale_first: bool, steps: int = 3) -> Watcher:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randn(8, 4)
    with watch(model, optimizer, scaler) as w:
        for _ in range(steps):
            loss = model(x).pow(2).mean()
            scaler.scale(loss).backward()
            if unscale_first:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            w.step(x, loss)
            optimizer.zero_grad()
    return w


def test_clipping_scaled_gradients_is_caught_once_with_the_fix() -> None:
    w = _clipped_loop(unscale_first=False)
    (warning,) = w.warnings
    assert (warning.code, warning.step) == ("clip_before_unscale", 0)
    assert "clip_grad_norm_ was called at " in warning.message
    assert "on scaled gradients" in warning.message
    assert "loss scale (65536)" in warning.message
    assert warning.fix.splitlines() == [
        "scaler.unscale_(optimizer)",
        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
    ]
    assert w.reports == []  # a mistake, not a non-finite step


def test_clipping_after_unscale_is_fine_and_the_wrappers_are_removed() -> None:
    original = torch.nn.utils.clip_grad_norm_
    w = _clipped_loop(unscale_first=True)
    assert w.warnings == []
    assert torch.nn.utils.clip_grad_norm_ is original
    from torch.nn.utils import clip_grad

    assert clip_grad.clip_grad_value_ is torch.nn.utils.clip_grad_value_


def test_fsdp_sharded_module_is_rerun_from_the_gathered_state() -> None:
    """An FSDP2 module's forward all-gathers its parameters: a copy re-run on one rank would
    hang. Without ``unsharded`` the step is reported unscanned and says why; with it, the full
    state dict is gathered and re-run in a plain module (single-rank gloo group on the CPU)."""
    import torch.distributed as dist

    fsdp = pytest.importorskip("torch.distributed.fsdp")
    if not hasattr(fsdp, "fully_shard") or not dist.is_gloo_available():
        pytest.skip("needs FSDP2 and gloo")
    from torch.distributed.device_mesh import init_device_mesh

    from nan_hunter.training.model_copy import sharded

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = build()
        fsdp.fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        assert sharded(model) and not sharded(build())
        x = torch.full((2, 4), 1e20)  # FP32 overflows in the squared loss: the step breaks
        events = []
        for unsharded in (None, build):
            with watch(model, on_problem="stop", unsharded=unsharded) as w:
                loss = model(x).pow(2).sum()
                loss.backward()
                events.append(w.step(x, loss))  # before optimizer.step(), as FSDP needs
                model.zero_grad()
        blind, scanned = events
        assert blind is not None and blind.report is None
        assert "not scanned: FSDP shards the module's parameters" in blind.detail
        assert "unsharded=" in blind.detail
        assert scanned is not None and scanned.report is not None
        first = scanned.report.findings[0]
        assert (first.code, first.module) == ("NH101", "0")  # the first Linear casts 1e20
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("clip", ["clip_grad_norm_", "clip_grad_value_"])
def test_both_clipping_functions_are_watched(clip: str) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randn(8, 4)
    with watch(model, optimizer, scaler) as w:
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        getattr(torch.nn.utils, clip)(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        w.step(x, loss)
    (warning,) = w.warnings
    assert f"{clip} was called at {__file__}:" in warning.message


def test_output_writes_the_json_report(tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x = torch.ones(2, 4)
    x[0, 0] = float("nan")
    with watch(model, output=tmp_path / "nan.json") as w:
        loss = model(x).sum()
        loss.backward()
        event = w.step(x, loss)
    assert event is not None and event.report_path == str(tmp_path / "nan.json")
    assert event.origin_rank == 0 and (event.rank, event.world_size) == (0, 1)
    data = json.loads((tmp_path / "nan.json").read_text())
    assert [f["code"] for f in data["findings"]] == ["NH001"]


class _Log(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.log(x[:, :1])  # log(0) where x[:, 0] is 0


def test_a_model_swapped_in_mid_training_is_not_re_run_as_the_old_one() -> None:
    """The loop reloads its model (a new object) and goes on with the watcher of the old one:
    the problem step is recorded, and not re-run on the old model, which did not run it."""
    torch.manual_seed(0)
    model = _Log()
    with watch(model, on_problem="report") as w:
        for step in range(4):
            if step == 2:  # "reload": a new model object, the same class
                model = _Log()
                model.load_state_dict(w.module.state_dict())
            x = torch.rand(4, 4) + 1
            if step == 3:
                x[:, 0] = 0.0
            loss = model(x).mean()
            loss.backward()
            w.step(x, loss)
    assert w.problems == 1
    event = w.reports[0]
    assert (event.step, event.report) == (3, None)
    assert event.detail == "the loss is -inf (not scanned: " + REPLACED_MODEL + ")"


def test_the_watched_models_own_problem_is_still_re_run() -> None:
    torch.manual_seed(0)
    model = _Log()
    with watch(model, on_problem="report") as w:
        for step in range(3):
            x = torch.rand(4, 4) + 1
            if step == 2:
                x[:, 0] = 0.0
            loss = model(x).mean()
            loss.backward()
            w.step(x, loss)
    report = w.reports[0].report
    assert report is not None
    assert [(f.code, f.op) for f in report.findings if f.origin] == [("NH301", "torch.log")]


def test_reaches_parameters_reads_the_graph_after_its_backward() -> None:
    model, other = _Log(), _Log()
    loss = model(torch.rand(2, 4) + 1).mean()
    loss.backward()
    assert reaches_parameters(loss, list(model.parameters())) is True
    assert reaches_parameters(loss, list(other.parameters())) is False
    assert reaches_parameters(loss.detach(), list(model.parameters())) is None
