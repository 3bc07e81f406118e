"""A model that catches an exception of ours and goes on (``except RuntimeError`` or ``except
Exception`` around a fallback path, as models do around optional kernels) must not make the scan
go on over the path it took instead: a bug of ours stays an ``InternalError``, a signal to the
runner still makes the pass run again, never a clean report over an op the tracer did not see.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import nan_hunter.trace.tracer as tracer
from nan_hunter.api import scan
from nan_hunter.errors import InternalError, UserCodeError, ours_lost_since, ours_raised_within
from nan_hunter.trace.deferred import StaleStatistics


class _FallsBack(nn.Module):
    """``fc`` in a try block; its fallback is harmless, the main path overflows FP16."""

    def __init__(self, catches: type[BaseException], then: str = "zeros") -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.catches = catches
        self.then = then

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            h = self.fc(x)
        except self.catches:
            if self.then == "raise":
                raise ValueError("the fallback path has no kernel either") from None
            h = torch.zeros_like(x)
        h = h * 1000
        return (h @ h.t()).sum()


def _once(raise_it: Callable[[], BaseException]) -> Callable[..., Any]:
    """``tracer.is_inplace`` that raises ``raise_it()`` at its first call (the first op of the
    pass: the linear inside the model's try block), then does its work."""
    original = tracer.is_inplace
    calls = []

    def patched(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise raise_it()
        return original(*args, **kwargs)

    return patched


@pytest.mark.parametrize("catches", [RuntimeError, Exception, BaseException])
def test_a_bug_of_ours_the_model_catches_is_still_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, catches: type[BaseException]
) -> None:
    monkeypatch.setattr(tracer, "is_inplace", _once(lambda: ValueError("a bug of ours")))
    torch.manual_seed(0)
    with pytest.raises(InternalError, match="ValueError: a bug of ours") as raised:
        scan(_FallsBack(catches), torch.randn(4, 8))
    assert isinstance(raised.value.__cause__, ValueError)


def test_a_bug_of_ours_stays_ours_when_the_models_fallback_then_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracer, "is_inplace", _once(lambda: ValueError("a bug of ours")))
    torch.manual_seed(0)
    with pytest.raises(InternalError, match="a bug of ours") as raised:
        scan(_FallsBack(RuntimeError, then="raise"), torch.randn(4, 8))
    assert isinstance(raised.value.__context__, ValueError)  # the model's own, as context
    assert "fallback" in str(raised.value.__context__)


def test_a_signal_the_model_catches_still_runs_the_pass_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model, x = _FallsBack(Exception), torch.randn(4, 8)
    expected = scan(model, x)
    assert [(f.code, f.op) for f in expected.findings][:1] == [("NH102", "Tensor.__matmul__")]

    monkeypatch.setattr(tracer, "is_inplace", _once(lambda: StaleStatistics("stale")))
    report = scan(model, x)
    assert report.status == expected.status == "findings"
    assert [(f.code, f.op, f.module, f.location, f.outputs) for f in report.findings] == [
        (f.code, f.op, f.module, f.location, f.outputs) for f in expected.findings
    ]


def test_the_record_is_per_thread_and_forgets_what_came_out() -> None:
    """What another thread raises is not this thread's; an exception of ours that came out of
    the model's call is not reported again by the next call."""
    mark = ours_raised_within()
    other = threading.Thread(target=lambda: InternalError(ValueError("another thread")))
    other.start()
    other.join()
    assert ours_lost_since(mark) is None

    mark = ours_raised_within()
    signal, bug = StaleStatistics("later"), InternalError(ValueError("first"))
    assert ours_lost_since(mark) is bug  # a bug before a signal
    assert signal is not bug
    mark = ours_raised_within()
    assert ours_lost_since(mark) is None


def test_a_models_own_error_with_nothing_of_ours_caught_stays_the_models() -> None:
    class _Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                raise RuntimeError("the model's own, caught")
            except RuntimeError:
                pass
            raise KeyError("the model's own, raised")

    with pytest.raises(UserCodeError, match="the model raised KeyError during forward"):
        scan(_Broken(), torch.randn(4, 8))
