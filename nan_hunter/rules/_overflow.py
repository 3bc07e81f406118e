"""Shared shape of the rules for a result that is finite in FP32 but beyond FP16's range."""

from __future__ import annotations

from nan_hunter.findings import Phase
from nan_hunter.rules._messages import fp32_reach, output_damage
from nan_hunter.rules.registry import Candidate, FixPlan, Rule


class RangeOverflowRule(Rule):
    """Matches a forward op (of ``ops``, or any op when None) whose FP32 reference is finite
    and exceeds the low-precision maximum; fixes it with an FP32 region."""

    ops: frozenset[str] | None = None

    def matches(self, c: Candidate) -> bool:
        return (
            c.phase is Phase.FORWARD
            and (self.ops is None or c.op_name in self.ops)
            and c.ref_finite is True
            and c.ref_abs_max is not None
            and c.ref_abs_max > c.fmt.max
        )

    def message(self, c: Candidate) -> str:
        return (
            f"{c.event.op} output exceeds the {c.fmt.name} maximum and gets "
            f"{output_damage(c)}{fp32_reach(c)}"
        )

    def fix(self, c: Candidate) -> FixPlan:
        return FixPlan(title=f"Compute {c.event.op} in FP32 (autocast disabled)", region=True)
