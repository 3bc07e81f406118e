"""``benchmarks/tiers.py`` measures what its variants claim to run (not how fast: no timing is
asserted). Its conclusion, that a two-tier scan does not pay, rests on the screen variants doing
the work a sound screen must do."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def tiers() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("tiers")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _ophavy(tiers: ModuleType) -> tuple[torch.nn.Module, torch.Tensor]:
    return tiers.build("ophavy", True)  # 20 tiny blocks


def test_the_checked_variant_queues_one_check_per_floating_result(tiers: ModuleType) -> None:
    model, batch = _ophavy(tiers)
    mode = tiers.CheckedEmulation()
    tiers.emulated_step(model, batch, lambda: mode)
    checked = len(mode.queue._results)
    # Under the CUDA policy only each block's linear computes in FP16 (its result times an
    # FP32 parameter promotes to FP32): 20 addmm forward, their mm and sum backward.
    assert mode.emulated >= 60
    assert checked >= mode.emulated  # every emulated op's result, and the passed-on ones
    assert mode.queue.pending == 0  # read back at the end
    assert all(mode.queue.stats(i).numel >= 0 for i in range(checked))


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


def test_the_emulated_step_computes_in_float16_under_the_cuda_policy(tiers: ModuleType) -> None:
    # A linear layer's result is FP16 under CUDA autocast: the step's loss carries it.
    model, batch = _ophavy(tiers)
    seen: list[torch.dtype] = []
    handle = model.blocks[0].mix.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    try:
        tiers.emulated_step(model, batch, lambda: tiers.LowPrecisionEmulation(torch.float16))
    finally:
        handle.remove()
    assert seen == [torch.float16]


def test_every_variant_runs_and_is_timed(
    tiers: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    times = tiers.time_variants("ophavy", reps=1, quick=True)
    assert set(times) == {"fp32", "dispatch", "intercept", "emulated", "checked", "screen", "scan"}
    assert all(len(v) == 1 and v[0] > 0 for v in times.values())
    tiers.report("ophavy", times)
    out = capsys.readouterr().out
    assert "two tiers, screen passes" in out and "one tier (today)" in out
