"""When a pass runs again, and how: the runner's retry decisions in one small value.

A pass can end in a signal rather than a result (``errors.PassSignal``), or a backward on a
kept graph can fail where a whole pass would not:

    ========================  ===========================  ==================================
    what ended the try        next try                     when there is none
    ========================  ===========================  ==================================
    ``UnmeasuredGradient``    every gradient of a          already measuring every one:
                              parameter's size measured    raised
    ``StaleStatistics``       every tensor read back as    already read back so: raised
                              it is seen (depth 0)
    a failed backward on a    the whole pass, and no       (a whole pass is always possible)
    kept graph (the model's   backward on a kept graph
    error, stale statistics)  again
    ========================  ===========================  ==================================

``PassRunner`` rewinds the random number generators and resets the gradient log before each
try it makes again (``pass_state``); this module only decides.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nan_hunter.errors import UserCodeError
from nan_hunter.precision.gradients import UnmeasuredGradient
from nan_hunter.trace.deferred import StaleStatistics

RETRIED = (UnmeasuredGradient, StaleStatistics)
"""What ends a whole pass's try and may start another (``RetryPolicy.after``)."""
RETRIED_ON_A_KEPT_GRAPH = (UnmeasuredGradient, StaleStatistics, UserCodeError)
"""What ends a backward on a kept graph and starts a whole pass
(``RetryPolicy.after_kept_graph``). Our own errors are not among them."""


@dataclass(frozen=True)
class RetryPolicy:
    """How the next try of a pass runs; ``after`` and ``after_kept_graph`` give the try after a
    failed one, or raise when there is none."""

    depth: int | None = None
    """Tensors that wait for their statistics before a batched read-back (None: the default;
    0: each is summarised when it is seen)."""
    every_histogram: bool = False
    """Measure every gradient of a parameter's size (once one was rounded out of sight)."""
    reuse_graph: bool = True
    """Whether a later backward may run on a kept forward's graph."""

    @property
    def log_depth(self) -> int | None:
        """The gradient log's depth for this try (None: keep the log's own)."""
        return 1 if self.depth == 0 else None

    def fresh(self) -> RetryPolicy:
        """The first try of a new pass: what earlier passes learnt (every histogram, no reuse
        of a graph) kept, statistics read back in batches again."""
        return replace(self, depth=None)

    def after(self, exc: BaseException) -> RetryPolicy:
        """The try after a whole pass ended in ``exc``; ``exc`` raised when no other try can
        tell more (one of ``RETRIED`` the policy already answers, or anything else)."""
        if isinstance(exc, UnmeasuredGradient) and not self.every_histogram:
            return replace(self, every_histogram=True)
        if isinstance(exc, StaleStatistics) and self.depth != 0:
            return replace(self, depth=0)
        raise exc

    def after_kept_graph(self, exc: BaseException) -> RetryPolicy:
        """The whole pass to run after a backward on a kept graph ended in ``exc``: with every
        histogram for an ``UnmeasuredGradient``; otherwise (a second backward the graph does
        not support: a custom ``autograd.Function`` that frees what its backward needs, an
        error the model raises only on a repeat, statistics gone stale) without reusing a graph
        again, so that this pass and the later ones run whole and a real error shows there.
        Anything not in ``RETRIED_ON_A_KEPT_GRAPH`` is raised."""
        if isinstance(exc, UnmeasuredGradient):
            return replace(self, every_histogram=True)
        if isinstance(exc, (UserCodeError, StaleStatistics)):
            return replace(self, reuse_graph=False)
        raise exc
