"""The eps rewrite NH201 and NH202 lead with: the constant FP16 cannot hold, written as one it
can, where the number is written."""

from __future__ import annotations

from nan_hunter.findings import Applicability
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.rules.registry import FixPlan
from nan_hunter.trace.summary import format_number

SAFE_EPS = "1e-4"
"""An eps FP16 holds as a normal number (its smallest normal is 6.1e-5)."""


def eps_rewrite(fmt: FloatFormat, value: float, line: int) -> FixPlan:
    """``1e-8`` -> ``1e-4`` on ``line`` (or the one place the file writes it: ``self.eps =
    1e-8``, a default ``eps=1e-8``, ``torch.tensor(1e-8)``); unsafe, it leads the plan it is
    an alternative of (``FixPlan.leads``)."""
    return FixPlan(
        title=f"Use an eps {fmt.name} can hold: {SAFE_EPS} instead of "
        f"{format_number(value)} (changes the numerics)",
        applicability=Applicability.UNSAFE,
        leads=True,
        rewrite="scalar",
        rewrite_line=line,
        value=value,
        literal=SAFE_EPS,
    )
