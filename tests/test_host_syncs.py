"""The scan's hot path reads nothing back to the host per op: statistics are read in batches.

Every way a tensor's value reaches Python (``item``, ``tolist``, ``bool()``, ``float()``,
``int()``, ``index()``) is counted while ``scan`` runs; a model four times as deep must cost no
more read-backs than the shallow one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from nan_hunter.api import scan
from nan_hunter.trace import deferred

_READ_BACKS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")


class _Block(nn.Module):
    """Eleven small ops, as in benchmarks/models.py's op-heavy model."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mix = nn.Linear(width, width)
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mix(x)
        h = h * self.scale + 0.5
        h = torch.tanh(h) * torch.sigmoid(h)
        h = F.layer_norm(h, h.shape[-1:])
        return x + 0.5 * h


def _model(blocks: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(_Block(8) for _ in range(blocks)))


@pytest.fixture
def read_backs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    seen: list[str] = []
    for name in _READ_BACKS:
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _o: Any = original, _n: str = name) -> Any:
            seen.append(_n)
            return _o(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield seen


def _sum_of_squares(output: torch.Tensor, batch: object) -> torch.Tensor:
    """Gradients large enough for FP16 at any depth (a mean would make them tiny)."""
    return output.float().square().sum()


def _count(read_backs: list[str], blocks: int) -> tuple[int, int]:
    model, x = _model(blocks), torch.randn(4, 8)
    read_backs.clear()
    # no loss scaling: a scaled backward that overflows (as GradScaler expects it to, now
    # and then) gets the detailed statistics of each non-finite gradient, read one by one
    report = scan(model, x, _sum_of_squares, grad_scale="none")
    assert report.status == "clean"
    return len(read_backs), report.ops


def test_read_backs_do_not_grow_with_the_number_of_ops(
    read_backs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deferred, "MAX_PENDING", 10**6)  # one read-back per pass and phase
    shallow, shallow_ops = _count(read_backs, 3)
    deep, deep_ops = _count(read_backs, 12)
    assert deep_ops - 3 == 4 * (shallow_ops - 3) > 0  # the loss: 3 ops
    assert deep == shallow
    assert shallow < 20  # a handful per scan: batch checks, loss, forward, backward, gradients


def test_default_batches_keep_read_backs_far_below_one_per_op(read_backs: list[str]) -> None:
    syncs, ops = _count(read_backs, 40)
    assert ops == 363
    # 360 forward ops, as many backward nodes, each with its tensors: batches of 512 tensors
    assert syncs <= 20


def test_the_eager_path_reads_back_per_tensor(
    read_backs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counter itself works: with a queue of depth 1 the read-backs follow the ops."""
    monkeypatch.setattr(deferred, "MAX_PENDING", 1)
    shallow, _ = _count(read_backs, 3)
    deep, _ = _count(read_backs, 12)
    assert deep > 3 * shallow


class _WritesOutOfSight(nn.Module):
    """Overwrites a traced op's output where no TorchFunctionMode sees it, after the op that
    read it: its statistics must be those from before the write."""

    def __init__(self, value: float, scale: float = 1.0) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.value = value
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x) * self.scale
        y = h + 0.5
        with torch._C.DisableTorchFunction():
            h.detach().fill_(self.value)
        return y


def _runs(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    runs: list[int | None] = []
    from nan_hunter.engine import runner

    original = runner.PassRunner._whole

    def counted(self: Any, scale: float, gradients: Any, events: bool) -> Any:
        runs.append(self._policy.depth)
        return original(self, scale, gradients, events)

    monkeypatch.setattr(runner.PassRunner, "_whole", counted)
    return runs


def test_a_write_out_of_sight_after_the_reduction_does_not_matter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = _runs(monkeypatch)
    torch.manual_seed(0)
    report = scan(_WritesOutOfSight(float("nan")), torch.randn(2, 4), backward=False)
    assert runs == [None]  # reduced when queued: the NaN written later is not seen
    assert report.status == "clean"
    assert report.ops == 3


def test_a_non_finite_tensor_written_out_of_sight_reruns_the_pass_eagerly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its detailed statistics are taken at the read-back from the tensor, which changed: the
    pass runs again, every tensor summarised when it is seen, and the report is the same as a
    depth-1 scan's."""
    runs = _runs(monkeypatch)
    torch.manual_seed(0)
    model = _WritesOutOfSight(0.0, scale=1e38)  # beyond FP16: the scaled output is inf
    x = torch.randn(2, 4)
    report = scan(model, x, backward=False)
    assert runs[:2] == [None, 0]
    monkeypatch.setattr(deferred, "MAX_PENDING", 1)
    runs.clear()
    eager = scan(model, x, backward=False)
    assert runs[0] is None and 0 not in runs
    assert report.findings == eager.findings
    (origin,) = [f for f in report.findings if f.origin]
    assert origin.op == "Tensor.__mul__"
    assert origin.outputs[0].nonfinite == 8  # as computed, not the zeros written later


def test_stale_statistics_are_detected_by_the_queue() -> None:
    from nan_hunter.precision.formats import FP16

    queue = deferred.StatsQueue(FP16)
    t = torch.tensor([float("nan"), 1.0])
    queue.add(t, True)
    t.fill_(0.0)
    with pytest.raises(deferred.StaleStatistics):
        queue.flush()
    big = deferred.StatsQueue(FP16, max_held=0)  # nothing held: a NaN cannot be detailed
    big.add(torch.tensor([float("nan")]), False)
    with pytest.raises(deferred.StaleStatistics):
        big.flush()
    ok = deferred.StatsQueue(FP16, max_held=0)
    slot = ok.add(torch.tensor([1.0, -2.0]), False)
    assert ok.stats(slot).min == -2.0


def test_batched_statistics_equal_the_eager_ones() -> None:
    from nan_hunter.precision.formats import FP16
    from nan_hunter.trace.stats import tensor_stats

    torch.manual_seed(0)
    tensors = [
        torch.randn(5, 7) * 1e-4,
        torch.randn(300, 300).half(),
        torch.tensor([0.0, 1e-6, float("nan"), -float("inf"), 2.0]),
        torch.zeros(0, 3),
        torch.arange(6),
        torch.randn(4).to(torch.bfloat16),
        torch.randn(3, dtype=torch.float64),
    ]
    queue = deferred.StatsQueue(FP16)
    slots = [(queue.add(t, counts), t, counts) for t in tensors for counts in (True, False)]
    assert queue.flushes == 0
    results = [(queue.stats(slot), t, counts) for slot, t, counts in slots]
    assert queue.flushes == 1
    for stats, t, counts in results:
        assert stats == tensor_stats(t, FP16, counts=counts)


class _PartlyInInferenceMode(nn.Module):
    """The first traced op runs under ``torch.inference_mode()``, the others outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            scale = x.abs().amax()
        return self.fc(x) * float(scale)


def test_statistics_are_taken_inside_and_outside_inference_mode() -> None:
    torch.manual_seed(0)
    report = scan(_PartlyInInferenceMode(), torch.randn(2, 4))
    assert report.status == "clean"
    assert report.ops == 4


def test_the_collector_runs_less_often_during_a_scan_and_as_before_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """During the passes and during the analysis after them (which also creates objects that
    live to the scan's end); the threshold is back when the scan returns."""
    import gc

    from nan_hunter.engine import scan as engine
    from nan_hunter.engine.pass_state import GC_THRESHOLD

    seen: list[int] = []
    analyse = engine.analyse

    def probed(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_threshold()[0])
        return analyse(*args, **kwargs)

    monkeypatch.setattr(engine, "analyse", probed)

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(gc.get_threshold()[0])
            return x * 2

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        scan(Probe(), torch.ones(3))
        assert len(seen) == 2 and all(t == GC_THRESHOLD for t in seen)  # forward, analysis
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_zero_and_subnormal_counts_from_the_bits_equal_the_float_ones(
    dtype: torch.dtype,
) -> None:
    """FP16/BF16 tensors in their own format are counted on their magnitude bits: -0.0 is a
    zero, a subnormal of either sign is tiny, NaN and inf are neither; small tensors exactly,
    large ones on the strided sample, as the float path counts them."""
    from nan_hunter.precision.formats import BF16, FP16
    from nan_hunter.trace.stats import tensor_stats

    fmt = FP16 if dtype == torch.float16 else BF16
    torch.manual_seed(0)
    for n in (12, 1000, 300_001):
        x = torch.randn(n) * 1e-2
        x[::5] = 0.0
        x[::7] = -0.0
        x[::11] *= fmt.smallest_normal * 10  # subnormal in the format, both signs
        x = x.to(dtype)
        queue = deferred.StatsQueue(fmt)
        slot = queue.add(x, True)
        stats = queue.stats(slot)
        assert stats == tensor_stats(x, fmt)
        assert stats.zeros is not None and stats.zeros >= n // 5
        assert stats.tiny
