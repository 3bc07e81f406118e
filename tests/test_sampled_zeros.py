"""Findings that read ``zeros`` on tensors large enough to be sampled (more than ``EXACT_UP_TO``
values: zeros are estimated on a strided sample there).

Without a recount, a value that flushes (or a divisor's 0) off the sample is invisible, and a
whole column of a row-major tensor whose row length is a multiple of the stride is never
sampled.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nan_hunter
from nan_hunter.core.batch import Batch
from nan_hunter.engine.runner import PassResult, PassRunner
from nan_hunter.precision.context import PrecisionPlan
from nan_hunter.precision.formats import FP16
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.stats import EXACT_UP_TO, sample_step

_N = 512  # 512 x 512 values: the sample takes every 16th, columns 0, 16, 32, ...


class _FlushedColumn(nn.Module):
    """Column 1 of the logits sits at -20: its sigmoid (2e-9) flushes to 0 in FP16, and the
    log of it is -inf (in FP32: -20). Every other logit is ~1."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(_N, _N)
        with torch.no_grad():
            self.fc.weight.mul_(0.01)
            self.fc.bias.fill_(1.0)
            self.fc.bias[1] = -20.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(self.fc(x))
        return torch.log(p)


def test_a_flush_off_the_sample_is_still_the_upstream_cause() -> None:
    assert _N * _N > EXACT_UP_TO and sample_step(_N * _N) == 16
    torch.manual_seed(0)
    model = _FlushedColumn()
    report = nan_hunter.scan(model, torch.randn(_N, _N) * 0.1, backward=False)
    (finding,) = report.findings
    assert finding.code == "NH202"
    assert finding.upstream is not None
    assert finding.upstream.op == "torch.sigmoid"


class _DivideByBuffer(nn.Module):
    def __init__(self, zero_at: int) -> None:
        super().__init__()
        self.fc = nn.Linear(_N, _N)
        divisor = torch.ones(_N, _N)
        divisor.view(-1)[zero_at] = 0.0
        self.register_buffer("divisor", divisor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) / self.divisor


def test_the_divisor_s_zeros_are_counted_not_estimated() -> None:
    """NH301 names how many zeros the divisor holds: one, wherever it is."""
    for zero_at in (1, 16):  # off the sample, on it
        torch.manual_seed(0)
        report = nan_hunter.scan(_DivideByBuffer(zero_at), torch.randn(_N, _N), backward=False)
        (finding,) = report.findings
        assert finding.code == "NH301"
        assert finding.message.endswith("the divisor holds 1 zeros"), (zero_at, finding.message)


# --- a clean scan estimates the zeros of large FP16 results; errors are analysed on exact ones


class _Dropped(nn.Module):
    """A large FP16 result with dropout's zeros (a fifth of the values, drawn from the RNG),
    then a division whose FP16 result overflows when ``overflow`` is set."""

    def __init__(self, overflow: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(_N, _N)
        self.drop = nn.Dropout(0.2)
        self.overflow = overflow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.fc(x))
        return h / 1e-5 if self.overflow else h


def _runner(model: nn.Module, batch: torch.Tensor) -> PassRunner:
    plan = PrecisionPlan("autocast", "cuda", "cpu", FP16, emulate=True)
    return PassRunner(
        model, lambda: Batch((batch,), {}, batch), None, FP16, plan.low_precision,
        plan.numerics, backward=False, exact_zeros=False,
    )  # fmt: skip


def _dropout_event(result: PassResult) -> OpEvent:
    return next(e for e in result.events if "dropout" in e.op)


def test_large_results_have_their_zeros_estimated_and_a_recount_counts_them() -> None:
    torch.manual_seed(0)
    model, batch = _Dropped(overflow=False), torch.randn(_N, _N)
    seen: list[torch.Tensor] = []
    model.drop.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    with _runner(model, batch) as runner:
        estimated = runner.run()
        exact = runner.recount(estimated)
        assert runner.forwards == 2
        assert runner.recount(exact) is exact  # counted already: nothing runs
        later = runner.run()
        assert runner.forwards == 3 and not later.estimated_zeros
    (rough,), (counted,) = _dropout_event(estimated).outputs, _dropout_event(exact).outputs
    assert estimated.estimated_zeros and not exact.estimated_zeros
    assert rough.numel == counted.numel == _N * _N
    # the same dropout mask both times: the recount starts from the pass's RNG state
    assert torch.equal(seen[0], seen[1])
    assert counted.zeros == seen[1].numel() - int(torch.count_nonzero(seen[1]))
    assert abs(rough.zeros - counted.zeros) < 0.02 * _N * _N  # ~52,000 zeros of 262,144
    assert rough.zeros != counted.zeros  # a strided sample's estimate, not the count
    # everything else as it was: the recount changes counts only
    assert [(e.key, [(s.min, s.max) for s in e.outputs]) for e in estimated.events] == [
        (e.key, [(s.min, s.max) for s in e.outputs]) for e in exact.events
    ]
    assert exact.grad_events == estimated.grad_events and exact.loss == estimated.loss


def test_only_a_verdict_that_reads_zero_counts_has_them_recounted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A clean scan, an overflow (NH109: the op fails on its own inputs) and a real bug (NH301:
    the divisor's zeros come from the FP32 pass) run no recount; an upstream flush to 0
    (NH202) is looked for on exact counts: the forward runs again, once."""
    import nan_hunter.engine.scan as engine

    passes: list[bool] = []  # per low-precision pass or recount: whether a recount
    real_run, real_recount = engine._Backward.run, engine._Backward.recount

    def run(self: object, *args: object, **kwargs: object) -> object:
        passes.append(False)
        return real_run(self, *args, **kwargs)  # type: ignore[arg-type]

    def recount(self: object, *args: object, **kwargs: object) -> object:
        passes.append(True)
        return real_recount(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine._Backward, "run", run)
    monkeypatch.setattr(engine._Backward, "recount", recount)

    def scanned(model: nn.Module, batch: torch.Tensor, code: str | None) -> list[bool]:
        passes.clear()
        torch.manual_seed(0)
        report = nan_hunter.scan(model, batch, backward=False, verify_fixes=False)
        assert [f.code for f in report.findings][:1] == ([code] if code else [])
        return list(passes)

    torch.manual_seed(0)
    assert scanned(_Dropped(overflow=False), torch.randn(_N, _N), None) == [False]
    torch.manual_seed(0)
    assert scanned(_Dropped(overflow=True), torch.randn(_N, _N), "NH109") == [False]
    assert scanned(_DivideByBuffer(1), torch.randn(_N, _N), "NH301") == [False]
    torch.manual_seed(0)
    flushed = _FlushedColumn()
    assert scanned(flushed, torch.randn(_N, _N) * 0.1, "NH202") == [False, True]

    class Small(nn.Module):  # every result within EXACT_UP_TO values: counted exactly at once
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            p = torch.sigmoid(torch.nn.functional.linear(x, torch.eye(64)) - 20.0)
            return torch.log(p)

    assert scanned(Small(), torch.randn(64, 64) * 0.1, "NH202") == [False]
