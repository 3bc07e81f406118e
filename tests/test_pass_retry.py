"""When a pass runs again, and how (``pass_retry.RetryPolicy``): each decision on its own."""

from __future__ import annotations

import pytest

from nan_hunter.engine.pass_retry import RETRIED, RETRIED_ON_A_KEPT_GRAPH, RetryPolicy
from nan_hunter.errors import InternalError, UserCodeError
from nan_hunter.precision.gradients import UnmeasuredGradient
from nan_hunter.trace.deferred import StaleStatistics


def test_a_first_try_batches_statistics_and_may_reuse_a_graph() -> None:
    first = RetryPolicy()
    assert (first.depth, first.every_histogram, first.reuse_graph) == (None, False, True)
    assert first.log_depth is None


def test_an_unmeasured_gradient_runs_again_measuring_every_histogram_once() -> None:
    again = RetryPolicy().after(UnmeasuredGradient("rounded out of sight"))
    assert again == RetryPolicy(every_histogram=True)
    with pytest.raises(UnmeasuredGradient):
        again.after(UnmeasuredGradient("again"))


def test_stale_statistics_run_again_reading_every_tensor_as_it_is_seen_once() -> None:
    again = RetryPolicy().after(StaleStatistics("written out of sight"))
    assert again.depth == 0 and again.log_depth == 1
    with pytest.raises(StaleStatistics):
        again.after(StaleStatistics("again"))


def test_both_signals_in_turn_keep_what_each_learnt() -> None:
    policy = RetryPolicy().after(StaleStatistics("")).after(UnmeasuredGradient(""))
    assert policy == RetryPolicy(depth=0, every_histogram=True)
    assert policy.fresh() == RetryPolicy(every_histogram=True)  # a new pass batches again


@pytest.mark.parametrize(
    "exc", [ValueError("the model's"), InternalError(KeyError("ours")), UserCodeError("model")]
)
def test_anything_else_ends_a_whole_pass(exc: BaseException) -> None:
    with pytest.raises(type(exc)):
        RetryPolicy().after(exc)


def test_a_failed_backward_on_a_kept_graph_runs_the_pass_whole_from_then_on() -> None:
    for exc in (UserCodeError("a second backward fails"), StaleStatistics("")):
        policy = RetryPolicy().after_kept_graph(exc)
        assert policy == RetryPolicy(reuse_graph=False)
        assert not policy.fresh().reuse_graph
    assert RetryPolicy().after_kept_graph(UnmeasuredGradient("")) == RetryPolicy(
        every_histogram=True
    )


def test_our_own_error_on_a_kept_graph_is_not_retried() -> None:
    with pytest.raises(InternalError):
        RetryPolicy().after_kept_graph(InternalError(ValueError("ours")))
    assert InternalError not in RETRIED_ON_A_KEPT_GRAPH and InternalError not in RETRIED
