"""``benchmarks/tiers.py`` measures what its variants claim to run (not how fast: no timing is
asserted). Its conclusion, that a two-tier scan does not pay, rests on the screen variants doing
the work a sound screen must do."""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from nan_hunter.engine import pass_state

pytestmark = pytest.mark.slow  # runs the benchmark's variants

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def tiers() -> Iterator[ModuleType]:
    # The benchmarks import one another as top-level modules (``models``, ``speed``): they go
    # again afterwards, with the path entries (``tiers`` adds its own), or a later test's own
    # ``models`` module would be this one.
    path = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("tiers")
    finally:
        sys.path[:] = path
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and Path(file).resolve().parent == BENCHMARKS:
                del sys.modules[name]


def _ophavy(tiers: ModuleType) -> tuple[torch.nn.Module, torch.Tensor]:
    return tiers.build("ophavy", True)  # 20 tiny blocks


def test_the_checked_screen_checks_what_the_scan_checks_in_the_forward(
    tiers: ModuleType,
) -> None:
    model, batch = _ophavy(tiers)
    original = tiers.op_calls.UntracedOps
    result, made = tiers.checked_pass(model, batch)
    assert tiers.op_calls.UntracedOps is original  # put back
    assert len(made) == 1 and result.events == () and result.backward_ran
    (mode,) = made
    checks = len(mode.queue._results)
    assert mode.queue.pending == 0  # read back at the end
    ops = tiers.scan(model, batch, settings=tiers.Settings(device="cpu")).ops
    # One check per result the tracer records (13 a block, views excepted), plus the default
    # loss's few ops (the tracer pauses for those); not one per aten op, forward and backward
    # (the gradient log checks every rounded gradient already).
    assert ops == 20 * 13 and ops <= checks <= ops + 8


def test_the_two_tier_figures_are_the_checked_screen_and_the_scan(
    tiers: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    times = {key: [1.0] for key in ("fp32", "dispatch", "intercept")}
    times.update(emulated=[1.25], screen=[2.0], checked=[2.5], scan=[3.0])
    tiers.report("m", times)
    out = capsys.readouterr().out
    assert "two tiers, screen passes:      2.50x" in out
    assert "two tiers, screen flags:       5.50x" in out
    assert "one tier (today):              3.00x" in out


def test_the_passthrough_variants_intercept_every_op_of_the_fp32_step(tiers: ModuleType) -> None:
    model, batch = _ophavy(tiers)
    alone, none = tiers.passthrough_step(model, batch)
    both, functions = tiers.passthrough_step(model, batch, functions=True)
    assert none is None and functions is not None
    assert alone.calls == both.calls > 20 * 11 * 2  # ~11 aten ops a block, forward and backward
    assert 20 * 11 <= functions.calls < alone.calls  # the forward's torch functions only
    assert all(p.grad is None for p in model.parameters())  # torch.autograd.grad, as fp32


def test_the_screen_runs_the_gradient_log_but_records_no_event(tiers: ModuleType) -> None:
    model, batch = _ophavy(tiers)
    result, log = tiers.screen_pass(model, batch)
    assert result.backward_ran and result.events == () and result.grad_events == ()
    assert result.gradients_finite is True
    # Every parameter whose gradient FP16 rounds (the linear layers'; scale and shift compute
    # in FP32) is measured.
    rounded = {name for name, _ in model.named_parameters() if ".mix." in name}
    assert set(result.param_grads) == rounded
    assert log.max_abs > 0


class _Softmax(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x), -1) * 3


def test_the_emulated_step_computes_in_float16_under_the_cuda_policy(tiers: ModuleType) -> None:
    # A linear layer's result is FP16 under autocast; softmax casts it to FP32 under CUDA's
    # policy only (CPU autocast leaves it FP16); the emulation runs in the backward too.
    model = _Softmax()
    seen: list[torch.dtype] = []
    model.fc.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    model.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    mode = tiers.LowPrecisionEmulation(torch.float16)
    tiers.emulated_step(model, torch.ones(3, 4), lambda: mode)
    assert seen == [torch.float16, torch.float32]
    assert mode.emulated == 3  # addmm forward; the weight's mm and the bias's sum backward


def test_every_variant_runs_and_is_timed(
    tiers: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    times = tiers.time_variants("ophavy", reps=1, quick=True)
    assert set(times) == {"fp32", "dispatch", "intercept", "emulated", "screen", "checked", "scan"}
    assert all(len(v) == 1 and v[0] > 0 for v in times.values())
    tiers.report("ophavy", times)
    out = capsys.readouterr().out
    assert "two tiers, screen passes" in out and "one tier (today)" in out


def test_every_variant_is_timed_with_the_scans_collector_threshold(
    tiers: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The passes raise the threshold themselves: the plain variants must not pay collections
    # the scan variants are spared.
    seen: dict[str, list[int]] = {}

    def recording(key: str) -> object:
        return lambda model, batch: seen.setdefault(key, []).append(gc.get_threshold()[0])

    monkeypatch.setattr(tiers, "variants", lambda: {k: recording(k) for k in ("fp32", "scan")})
    before = gc.get_threshold()
    tiers.time_variants("ophavy", reps=1, quick=True)
    timed = {key: calls[1:] for key, calls in seen.items()}  # after the warm-up
    assert timed == {"fp32": [pass_state.GC_THRESHOLD], "scan": [pass_state.GC_THRESHOLD]}
    assert gc.get_threshold() == before
