"""The scan's speed measures: estimated zeros and their recount, and the backward's per-node
FP32 copies (``_NodeUpcasts``). Each test failed before them; with ``PassRunner.recount`` alone
the first two pass and the others still fail."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nan_hunter
import nan_hunter.engine.pass_state as pass_state
import nan_hunter.engine.runner as runner_module
from nan_hunter.core.batch import Batch
from nan_hunter.engine.runner import PassRunner
from nan_hunter.precision.context import PrecisionPlan
from nan_hunter.precision.emulation import LowPrecisionEmulation
from nan_hunter.precision.formats import FP16
from nan_hunter.trace.stats import EXACT_UP_TO

pytestmark = pytest.mark.slow  # times whole scan processes

_N = 512  # 512 x 512 values: beyond EXACT_UP_TO, so a low pass estimates their zeros


# --- the exact pass repeats the pass it counts, dropout masks included ------------------------


class _Dropped(nn.Module):
    """An identity layer then dropout (p=0.5) over the batch: one value of the batch is 40,000,
    which dropout's 1/(1-p) turns into 80,000, inf in FP16, when its mask keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(_N, _N)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(_N))
            self.fc.bias.zero_()
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc(x))


def _batch() -> torch.Tensor:
    x = torch.rand(_N, _N)
    x[0, 3] = 40000.0
    return x


@pytest.mark.parametrize("backward", [False, True])
def test_the_exact_pass_after_a_forward_not_kept_draws_the_same_dropout_masks(
    backward: bool,
) -> None:
    """``PassRunner.recount`` runs the forward again "from the RNG state [...] (the same
    dropout masks)"; a forward beyond ``RETAIN_BYTES`` is not kept, and before the exact
    pass then drew the next masks instead."""
    assert _N * _N > EXACT_UP_TO
    torch.manual_seed(0)
    model, batch = _Dropped(), _batch()
    masks: list[torch.Tensor] = []
    model.drop.register_forward_hook(lambda m, i, o: masks.append(o.detach() == 0))
    plan = PrecisionPlan("autocast", "cuda", "cpu", FP16, emulate=True)
    with PassRunner(
        model, lambda: Batch((batch,), {}, batch), None, FP16, plan.low_precision,
        plan.numerics, backward=backward, exact_zeros=False, retain_bytes=0,
    ) as runner:  # fmt: skip
        estimated = runner.run()
        exact = runner.recount(estimated)
    assert estimated.estimated_zeros and not exact.estimated_zeros
    assert len(masks) == 2
    assert torch.equal(masks[0], masks[1])


def _seeded(seed: int) -> None:
    """The scan seeds its compared passes itself (``pass_state.compared_pass_start``): another
    seed there is what draws other dropout masks."""
    torch.manual_seed(seed)
    pass_state.COMPARED_PASS_SEED = seed


@pytest.fixture(autouse=True)
def _default_seed_back() -> object:
    yield
    pass_state.COMPARED_PASS_SEED = 0


def _findings(seed: int, **options: object) -> list[tuple[str, str, int]]:
    _seeded(seed)
    report = nan_hunter.scan(_Dropped(), _batch(), verify_fixes=False, **options)
    return [(f.code, f.op, sum(s.nonfinite for s in f.outputs)) for f in report.findings]


def test_an_error_found_on_one_dropout_mask_is_reported_whether_the_forward_is_kept_or_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first pass finds the inf its mask let through; the recount must count that same
    pass. Before, when the forward is not kept (outputs beyond ``RETAIN_BYTES``), the exact
    pass drew fresh masks: with seed 7 the error vanished (a clean report), with seed 4 an NH109
    became an NH900."""
    seeds = range(8)
    kept = [_findings(seed, backward=False) for seed in seeds]
    assert any(kept), "no seed lets the inf through: the test shows nothing"
    monkeypatch.setattr(runner_module, "RETAIN_BYTES", 0)
    not_kept = [_findings(seed, backward=False) for seed in seeds]
    assert not_kept == kept


class _DroppedHidden(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(_N, _N)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(_N, _N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.fc(x)))


def _backward_findings(seed: int) -> list[tuple[str, str, list[int]]]:
    _seeded(seed)
    report = nan_hunter.scan(
        _DroppedHidden(), torch.randn(_N, _N), lambda out, b: out.float().sum(),
        grad_scale=4096.0, verify_fixes=False,
    )  # fmt: skip
    return [(f.code, f.op, [s.nonfinite for s in f.outputs]) for f in report.findings]


def test_the_exact_pass_repeats_the_analysed_pass_not_the_loss_scale_window_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fixed loss scale whose gradients overflow (NH401 in the first layer's backward, how
    many values depends on the dropout mask): the loss-scale window runs an unscaled pass after
    the analysed one. The recount must repeat the analysed pass's forward, kept or not;
    before, without a kept forward, it repeated the window pass's instead."""
    kept = _backward_findings(0)
    assert [code for code, _, _ in kept] == ["NH401"]
    monkeypatch.setattr(runner_module, "RETAIN_BYTES", 0)
    assert _backward_findings(0) == kept


# --- the backward's cached FP32 copies -------------------------------------------------------


def test_a_gradient_a_hook_rescales_through_data_is_read_rescaled() -> None:
    """A tensor hook runs inside the node that consumes the gradient (same current node): it
    reads the gradient (an emulated op: its FP32 copy is cached under that node), then halves it
    through ``.data``, which moves no version counter of the gradient itself. Before the
    node's mm reads the stale copy: the weight's gradient is twice what it should be."""
    torch.manual_seed(0)
    x = torch.randn(4, 8).half()
    w = torch.randn(8, 8).half().requires_grad_()

    def clip(g: torch.Tensor) -> None:
        g.abs().amax()  # a read of g (emulated)
        g.data.mul_(0.5)

    with LowPrecisionEmulation():
        h = x @ w
        h.register_hook(clip)
        (h * 3).sum().backward()
    assert w.grad is not None
    expected = (x.float().t() @ torch.full((4, 8), 1.5)).half()
    assert torch.equal(w.grad, expected)


with torch.inference_mode():
    _HALF = torch.full((8,), 0.5, dtype=torch.float16)  # an inference tensor: no version counter


class _TimesHalf(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        return g * _HALF


class _WithConstant(nn.Module):
    def __init__(self, hooked: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.hooked = hooked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.hooked:
            h.register_hook(lambda g: g * _HALF)
            return h * 0.5
        return _TimesHalf.apply(h)


@pytest.mark.parametrize("hooked", [False, True])
def test_a_backward_that_reads_an_inference_tensor_scans(hooked: bool) -> None:
    """A constant made under ``torch.inference_mode()`` read by a custom Function's backward or
    a gradient hook: ``x.float()`` reads it fine, but before the upcast cache asks for its
    ``_version`` and the scan fails ("Inference tensors do not track version counter")."""
    torch.manual_seed(0)
    report = nan_hunter.scan(_WithConstant(hooked), torch.randn(4, 8), verify_fixes=False)
    assert report.status == "clean"
    assert report.backward_nodes > 0


# --- the gradient log's node --------------------------------------------------------------


class _Once(torch.autograd.Function):
    """Its backward runs once: a second backward on a kept graph fails (as a Function that
    frees what its backward needs does), and the pass runs whole again."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.done = False  # type: ignore[attr-defined]
        return x * 2

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        if ctx.done:  # type: ignore[attr-defined]
            raise RuntimeError("backward twice")
        ctx.done = True  # type: ignore[attr-defined]
        return g * 2


class _Three(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(_Once.apply(self.b(torch.relu(self.a(x)))))


def test_a_failed_backward_s_graph_is_freed_before_the_pass_runs_again() -> None:
    """The kept graph's second backward fails; the pass runs whole again. Before the
    gradient log still holds the last autograd node it asked about (``reset`` does not let go
    of it), and through it the first forward's activations live on beside the second's."""
    import gc
    import weakref

    from nan_hunter.precision.gradients import GradientLog

    torch.manual_seed(0)
    model = _Three()
    saved: list[weakref.ref[torch.Tensor]] = []
    alive: list[bool] = []
    model.b.register_forward_hook(lambda m, i, o: saved.append(weakref.ref(i[0])))
    model.a.register_forward_pre_hook(lambda m, i: alive.extend(r() is not None for r in saved))
    batch = torch.randn(32, 64)
    plan = PrecisionPlan("autocast", "cuda", "cpu", FP16, emulate=True)
    with PassRunner(
        model, lambda: Batch((batch,), {}, batch), None, FP16, plan.low_precision,
        plan.numerics, backward=True,
    ) as runner:  # fmt: skip
        log = GradientLog(FP16)
        runner.run(1.0, log)
        gc.collect()
        runner.run(2.0, log)  # fails on the kept graph, then runs whole
        assert runner.forwards == 2
    assert alive == [False]  # the first forward's activation, when the second forward starts
