"""Passes at several loss scales share one forward (``runner.PassRunner``).

The low-precision forward does not depend on the loss scale, so when the scan needs backwards at
several scales (GradScaler's back-off, the unscaled window, a cast boundary's scale) they run on
one retained graph. For a model without randomness the reports must be exactly those of a
forward per backward; a model with dropout now gets one mask for all of them, as one training
step does. The model must be restored exactly.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from types import ModuleType
from typing import Any

import pytest
import torch

from nan_hunter.api import scan
from nan_hunter.engine import runner, traced_forward
from nan_hunter.engine.model_state import ModelState
from tests.conftest import FIXTURES


def _load(name: str) -> ModuleType:
    path = FIXTURES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_shared_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scan_counting_forwards(name: str) -> tuple[object, int, list[torch.Tensor]]:
    """The report of fixture ``name``, how many times its model's forward ran, and its
    parameters and buffers after the scan."""
    fixture = _load(name)
    model = fixture.build_model()
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    report = scan(model, fixture.sample_batch(), getattr(fixture, "loss_fn", None))
    state = [t.detach().clone() for t in (*model.parameters(), *model.buffers())]
    return report, len(calls), state


def _same(a: object, b: object) -> None:
    """Reports equal but for the time they took."""
    assert dataclasses.replace(a, seconds=0.0) == dataclasses.replace(b, seconds=0.0)  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("name", "low_passes"),
    [("fx_backward_inf", 3), ("fx_subnormal_activations", 3), ("fx_loss_weight_underflow", 2)],
)
def test_backwards_at_several_scales_share_one_forward(
    name: str, low_passes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared, forwards, state = _scan_counting_forwards(name)
    monkeypatch.setattr(runner, "RETAIN_BYTES", -1)  # a forward per backward, as before
    again, forwards_again, state_again = _scan_counting_forwards(name)
    _same(shared, again)
    reference = 1 if shared.reference_loss is not None else 0  # the FP32 pass
    assert forwards == 1 + reference
    assert forwards_again == low_passes + reference
    assert all(torch.equal(a, b) for a, b in zip(state, state_again, strict=True))


def test_a_large_forward_is_run_again_rather_than_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond ``RETAIN_BYTES`` of traced outputs the graph is not kept (it would hold every
    activation to the end of the backward): each backward gets its own forward."""
    monkeypatch.setattr(runner, "RETAIN_BYTES", 0)
    report, forwards, _ = _scan_counting_forwards("fx_backward_inf")
    assert forwards == 3 + 1
    assert [f.code for f in report.findings][:1] == ["NH401"]


def test_the_model_is_restored_after_shared_backwards() -> None:
    fixture = _load("fx_backward_inf")
    model = fixture.build_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad for p in model.parameters()]
    scan(model, fixture.sample_batch(), fixture.loss_fn)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [p.grad for p in model.parameters()] == grads
    assert all(p.dtype == torch.float32 for p in model.parameters())


class _BackwardOnce(torch.autograd.Function):
    """Identity whose backward works once per forward (it frees what it needs), like a
    custom kernel that releases its buffers: a second backward on the kept graph fails."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.spent = False
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if ctx.spent:
            raise RuntimeError("the buffers of this backward were already freed")
        ctx.spent = True
        return grad


class _OverflowingBackward(torch.nn.Module):
    """fx_backward_inf's model with ``_BackwardOnce`` after its layer: the scan needs backwards
    at several loss scales (its gradient overflows at all of them)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _BackwardOnce.apply(self.fc(x))


def test_a_graph_that_cannot_run_backward_twice_gets_a_forward_per_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def loss_fn(output: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return output.float().sum() * 1e5

    def scan_once() -> tuple[object, int]:
        torch.manual_seed(0)
        model = _OverflowingBackward()
        calls = []
        model.register_forward_pre_hook(lambda module, args: calls.append(1))
        return scan(model, torch.randn(2, 8), loss_fn), len(calls)

    report, forwards = scan_once()
    monkeypatch.setattr(runner, "RETAIN_BYTES", -1)
    expected, expected_forwards = scan_once()
    _same(report, expected)
    assert [f.code for f in report.findings][:1] == ["NH401"]
    # every kept forward served one backward; its second one failed and ran the pass whole
    assert forwards == expected_forwards


def _window_runner(model: torch.nn.Module, batch: torch.Tensor) -> runner.PassRunner:
    from nan_hunter.core.batch import Batch
    from nan_hunter.precision.context import PrecisionPlan
    from nan_hunter.precision.formats import FP16

    plan = PrecisionPlan(mode="autocast", policy="cuda", device="cpu", fmt=FP16, emulate=True)
    return runner.PassRunner(
        model, lambda: Batch((batch,), {}, batch), None, FP16, plan.low_precision, plan.numerics,
        backward=True,
    )  # fmt: skip


def test_a_gradients_only_backward_says_whether_they_stayed_finite() -> None:
    """The loss-scale window's backwards skip the per-node events; whether a scale overflows
    is read from the gradients themselves: the log's exact values (65520 and up become inf in
    FP16) and every parameter's gradient."""
    from nan_hunter.precision.formats import FP16
    from nan_hunter.precision.gradients import GradientLog

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    batch = torch.randn(4, 8)
    with _window_runner(model, batch) as passes:
        traced = passes.run(1.0, GradientLog(FP16))
        assert traced.grad_events and traced.gradients_finite is None
        fine = GradientLog(FP16)
        measured = passes.run(1.0, fine, events=False)
        assert measured.grad_events == () and measured.gradients_finite is True
        assert not fine.overflowed and measured.param_grads.keys() == traced.param_grads.keys()
        assert measured.param_grads == traced.param_grads
        too_far = GradientLog(FP16)
        overflowing = passes.run(2.0**40, too_far, events=False)
        assert overflowing.gradients_finite is False and too_far.overflowed
        assert passes.forwards == 1


def test_a_gradients_only_pass_without_the_kept_graph_runs_its_forward_untraced() -> None:
    """Where the graph is not kept, a loss-scale window's pass runs the forward again: it only
    measures gradients, so the forward runs emulated but not traced (no events), with the same
    gradients; a later pass with events runs a traced forward of its own."""
    from nan_hunter.precision.formats import FP16
    from nan_hunter.precision.gradients import GradientLog

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    batch = torch.randn(4, 8)
    with _window_runner(model, batch) as passes:
        passes._retain_bytes = -1  # no graph kept: a forward per pass
        traced = passes.run(1.0, GradientLog(FP16))
        assert len(traced.events) == 3 and traced.grad_events  # linear, gelu, linear
        measured = passes.run(1.0, GradientLog(FP16), events=False)
        assert passes.forwards == 2 and measured.events == () and measured.grad_events == ()
        assert measured.gradients_finite is True
        assert measured.param_grads == traced.param_grads
        again = passes.run(1.0, GradientLog(FP16))
        assert passes.forwards == 3 and again.events == traced.events


def test_a_finished_pass_lets_go_of_its_state_snapshot_and_batch() -> None:
    """Freed by reference counting alone (the collector is off here, and runs rarely during a
    scan): when the FP32 reference pass starts, the low-precision pass's copy of the buffers
    and its copy of the batch are gone."""
    import gc

    class WithBuffer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 2)
            self.register_buffer("table", torch.randn(64, 64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + self.table[0, :2]

    torch.manual_seed(0)
    model = WithBuffer()
    alive: list[tuple[int, int]] = []

    def count(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        objects = gc.get_objects()
        states = sum(type(o) is ModelState for o in objects)
        batches = sum(
            type(o) is torch.Tensor and o.shape == (4, 16) and o is not batch for o in objects
        )
        alive.append((states, batches))

    batch = torch.randn(4, 16)
    model.register_forward_pre_hook(count)
    enabled = gc.isenabled()
    gc.collect()  # what earlier tests left to the collector is not this scan's
    gc.disable()
    try:
        report = scan(model, batch, lambda out, b: out.float().sum() * 1e5)
    finally:
        if enabled:
            gc.enable()
    assert report.reference_loss is not None  # the FP32 pass ran: two forwards seen
    # only the running pass's snapshot and its copy of the batch (args and raw: two tensors)
    assert alive == [(1, 2), (1, 2)]


def test_a_parameter_without_values_does_not_stop_the_gradients_check() -> None:
    """A used zero-size parameter (a prefix of length 0, a rank-0 adapter) has an empty
    gradient: the gradients-only backwards of the loss-scale window skip it."""

    class EmptyPrefix(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 2)
            self.prefix = torch.nn.Parameter(torch.zeros(0, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.prefix, self.fc(x)], dim=0)

    torch.manual_seed(0)
    report = scan(EmptyPrefix(), torch.randn(2, 8), lambda out, b: out.float().sum() * 1e5)
    assert [f.code for f in report.findings][:1] == ["NH401"]
    assert traced_forward._all_finite((torch.zeros(0), None, torch.ones(3)))
    empty = (torch.zeros(1, 0, dtype=torch.long), torch.zeros(0))
    sparse = torch.sparse_coo_tensor(*empty, (5,), check_invariants=True)
    assert traced_forward._all_finite((sparse,))
    assert not traced_forward._all_finite((torch.tensor([1.0, float("inf")]),))


def test_all_finite_tells_an_overflowing_sum_from_a_non_finite_value() -> None:
    """The cheap check sums each gradient: a sum beyond FP32's range on finite values is
    checked exactly, not taken for inf."""
    big = torch.full((4,), 3e38)
    assert not torch.isfinite(big.sum())
    assert traced_forward._all_finite((torch.ones(3), big))
    assert traced_forward._all_finite((torch.full((8,), 60000.0, dtype=torch.float16),))
    assert not traced_forward._all_finite((big, torch.tensor([0.0, float("nan")])))
    assert not traced_forward._all_finite((torch.tensor([float("-inf")], dtype=torch.float16),))


def test_a_model_with_dropout_backs_off_on_one_forward() -> None:
    """GradScaler's back-off analyses one step at several scales: one dropout mask for all of
    the backwards, and the same report for the same seed."""

    class Dropped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(self.fc(x))

    def scan_once() -> tuple[object, int]:
        torch.manual_seed(0)
        model = Dropped()
        calls = []
        model.register_forward_pre_hook(lambda module, args: calls.append(1))
        report = scan(model, torch.randn(16, 8), lambda out, b: out.float().sum() * 1e5)
        return report, len(calls)

    (first, forwards), (second, _) = scan_once(), scan_once()
    _same(first, second)
    scaling = first.target.loss_scaling  # type: ignore[attr-defined]
    assert scaling is not None and scaling.used < scaling.initial  # backed off
    assert forwards == 2  # the low-precision one for every scale, and the FP32 reference


def test_a_scan_leaves_the_callers_random_state_as_it_was() -> None:
    """The dropout masks a scan draws come from the global generator; the caller's next draw
    is the one it would have made without the scan, and two scans in a row agree."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    batch = torch.randn(4, 8)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = scan(model, batch)
    second = scan(model, batch)
    assert torch.equal(torch.rand(3), expected)
    _same(first, second)
