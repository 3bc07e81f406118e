"""The fix search stays cheap: at most 5 re-scans per finding on the fixtures whose search goes
furthest (an eps whose change moves the loss tries its rewrite, the elementwise ops upcast with
no region (autocast), the region and the grown region, and the whole function or in half mode
the module kept in FP32; the inverse at a region boundary tries the matmul alone, the region
with its producer, then grows once). An eps whose change is measured harmless costs one
re-scan: it comes first, and nothing after it is tried. The search's own cap is 6
(``MAX_RESCANS``).
``benchmarks/fix_search_cost.py`` prints the figure for all."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nan_hunter.fixes.verify as verify
from nan_hunter.api import scan_file
from nan_hunter.project.config import load_settings

FIXTURES = Path(__file__).parent / "fixtures"
MAX_RESCANS_PER_FINDING = 5


@pytest.mark.parametrize(
    ("name", "mode", "expected"),
    [("fx_eps_large_change", "autocast", 5), ("fx_eps_large_change", "half", 5),
     ("fx_eps_underflow", "autocast", 1), ("fx_eps_underflow", "half", 1),
     ("fx_inverse_boundary", "autocast", 3), ("fx_matmul_overflow", "autocast", 1)],
)
def test_a_findings_search_costs_at_most_five_rescans(
    name: str, mode: str, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 0
    original = verify.overlay

    @contextlib.contextmanager
    def counting(*args: Any, **kwargs: Any) -> Iterator[Any]:
        nonlocal count
        count += 1
        with original(*args, **kwargs) as value:
            yield value

    monkeypatch.setattr(verify, "overlay", counting)
    report = scan_file(str(FIXTURES / f"{name}.py"), load_settings(overrides={"mode": mode}))
    fixable = [f for f in report.findings if f.is_error and f.fix is not None and f.fix.edits]
    assert len(fixable) == 1
    assert count == expected
    assert count / len(fixable) <= MAX_RESCANS_PER_FINDING
