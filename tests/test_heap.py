"""The C heap's free pages go back to the system between a pass's forward and its backward."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch import nn

from nan_hunter.api import scan
from nan_hunter.engine import traced_forward
from nan_hunter.precision import heap


def test_the_heap_is_trimmed_once_per_forward_before_its_first_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once per forward: a second backward on the same graph (another loss scale) finds the
    forward's temporaries given back already, and trimming again would only make the heap
    fault its pages in anew."""
    seen: list[str] = []

    def trim() -> bool:
        seen.append("trim")
        return True

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append("forward")
            return self.fc(x)

    monkeypatch.setattr(traced_forward, "trim_heap", trim)
    torch.manual_seed(0)
    report = scan(Probe(), torch.randn(2, 4))
    assert report.status == "clean"
    assert seen == ["forward", "trim"]


def test_trimming_is_a_no_op_where_there_is_no_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert heap._load_malloc_trim() is None
    monkeypatch.setattr(heap, "_malloc_trim", None)
    assert heap.trim_heap() is False


@pytest.mark.skipif(heap._malloc_trim is None, reason="not glibc")
def test_trimming_returns_freed_heap_pages_to_the_system() -> None:
    """Small blocks (below the mmap threshold) freed between live ones stay resident until the
    trim."""

    def resident_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    blocks = [torch.ones(16 << 10) for _ in range(2048)]  # 64 KiB each, 128 MiB
    del blocks[::2]  # every other one: holes the heap cannot give back from its top
    before = resident_mib()
    assert heap.trim_heap() is True
    assert resident_mib() < before - 32
    del blocks


def test_the_trimmer_trims_each_time_its_bytes_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(heap, "_malloc_trim", lambda pad: calls.append(pad) or 1)
    trimmer = heap.HeapTrimmer(100)
    for _ in range(9):
        trimmer.freed(30)  # 270 bytes: two thresholds crossed
    assert trimmer.trims == 2 and calls == [0, 0]


def test_the_emulated_backward_trims_as_its_temporaries_add_up_and_the_forward_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paced by the FP32 temporaries of the emulated backward: with a period of one byte,
    every emulated backward op trims; the forward's ops never do (its holes go at once, in
    the one trim before the backward)."""
    from nan_hunter.precision import emulation

    phases: list[str] = []
    monkeypatch.setattr(heap, "backward_trim_bytes", lambda: 1)
    monkeypatch.setattr(
        heap, "_malloc_trim",
        lambda pad: phases.append(
            "backward" if torch._C._current_graph_task_id() != -1 else "forward"
        ) or 1,
    )  # fmt: skip
    monkeypatch.setattr(
        traced_forward, "trim_heap", lambda: phases.append("before backward") or True
    )
    emulated: list[emulation.LowPrecisionEmulation] = []
    init = emulation.LowPrecisionEmulation.__init__

    def keep(self: emulation.LowPrecisionEmulation, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        emulated.append(self)

    monkeypatch.setattr(emulation.LowPrecisionEmulation, "__init__", keep)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    assert scan(model, torch.randn(4, 8)).status == "clean"
    # ... and once after the scan (``large_blocks_from_heap``: its free pages go back)
    assert phases[-1] == "forward"
    phases.pop()
    assert phases[0] == "before backward" and "forward" not in phases
    backward_trims = sum(m.heap.trims for m in emulated)
    assert backward_trims == phases.count("backward") >= 4  # two matmuls' worth, at least


@pytest.mark.skipif(heap._mallopt is None, reason="not glibc")
def test_large_blocks_come_from_the_heap_during_a_scan_and_the_defaults_come_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within the block (nested: the outermost one restores) no block is mapped on its own and
    ``free`` leaves the heap's top; after it, glibc's defaults and one trim."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(heap, "_mallopt", lambda param, value: calls.append((param, value)) or 1)
    trims: list[int] = []
    monkeypatch.setattr(heap, "_malloc_trim", lambda pad: trims.append(pad) or 1)
    with heap.large_blocks_from_heap() as applied:
        with heap.large_blocks_from_heap():
            assert calls == [(heap._M_MMAP_MAX, 0), (heap._M_TRIM_THRESHOLD, heap._NO_TRIM)]
        assert applied and len(calls) == 2 and not trims
    assert calls[2:] == [
        (heap._M_MMAP_MAX, heap._DEFAULT_MMAP_MAX),
        (heap._M_TRIM_THRESHOLD, heap._DEFAULT_TRIM_THRESHOLD),
    ]
    assert trims == [0]


def test_a_large_model_trims_its_backward_once_per_weights_worth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The backward's trim period is the model's parameter bytes where they pass
    ``BACKWARD_TRIM_BYTES`` (its temporaries are weight-sized), and that value elsewhere."""
    monkeypatch.setattr(heap, "BACKWARD_TRIM_BYTES", 100)
    assert heap.backward_trim_bytes() == 100
    with heap.trims_paced_by(1000):
        assert heap.backward_trim_bytes() == 1000
        with heap.trims_paced_by(10):
            assert heap.backward_trim_bytes() == 100
        assert heap.backward_trim_bytes() == 1000
    assert heap.backward_trim_bytes() == 100
