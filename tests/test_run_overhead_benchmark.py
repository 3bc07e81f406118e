"""``benchmarks/run_overhead.py`` measures what it says: ABBA blocks (BAAB every other) in which
only the B segments run with ``nan-hunter run``'s watch attached, one ratio per block, and a
bootstrap interval around the median of those ratios. No timing is asserted."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from nan_hunter.project.config import Settings
from nan_hunter.training import script_patches
from nan_hunter.training.attach import ScriptWatch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    path = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("run_overhead")
    finally:  # the benchmarks' top-level modules (``models``) must not shadow a later test's
        sys.path[:] = path
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and Path(file).resolve().parent == BENCHMARKS:
                del sys.modules[name]


def test_only_the_b_segments_run_attached_in_abba_then_baab_order(bench: ModuleType) -> None:
    attached: list[bool] = []

    class Recording(bench.Loop):
        def steps(self, n: int) -> None:
            attached.append(script_patches._active is not None)
            super().steps(n)

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    variant = bench.Variant("no scaler", scaler=False)
    loop = Recording(variant, model, torch.randn(3, 4), torch.float32)
    watch = ScriptWatch(Settings(), lambda event: None)
    bench.blocks(loop, watch, 3, 2)
    assert attached == [False, True, True, False, True, False, False, True,
                        False, True, True, False]
    assert len(variant.ratios) == len(variant.plain) == 3
    assert watch.steps == 3 * 2 * 2  # the attached segments' steps, all checked
    assert script_patches._active is None


def test_the_bootstrap_interval_holds_the_median(bench: ModuleType) -> None:
    values = [1.0 + 0.001 * i for i in range(41)]
    low, high = bench.bootstrap_median(values)
    assert low <= 1.02 <= high and high - low < 0.02
