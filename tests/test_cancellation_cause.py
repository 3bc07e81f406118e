"""A subtraction of values that are equal in FP16 (``1 - p`` with ``p`` 0.99999 in FP32, 1.0 in
FP16) is named as such, with the Python number FP16 turned into 1, and not as "values flushed to
0": two different FP16 numbers never subtract to 0, so those zeros are the operands' rounding.
The kind follows the FP32 difference: below FP16's smallest normal it is an underflow, above it
the output's inf."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest

from nan_hunter.api import scan_file
from nan_hunter.findings import Finding, Kind
from nan_hunter.precision.formats import BF16, FP16

MODEL = """\
import torch
from torch import nn

KEEP = {keep}


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.keep = KEEP

    def forward(self, x):
        p = torch.sigmoid(self.fc(x))
        return torch.log({expression}).mean()


def build_model():
    torch.manual_seed(0)
    m = Head()
    with torch.no_grad():
        m.fc.weight.fill_(1.0)
        m.fc.bias.zero_()
    return m


def sample_batch():
    return torch.full((4, 8), 2.0)
"""
"""``sigmoid(16)`` is 0.99999989 in FP32 and 1.0 in FP16."""

KEEPS = {
    "attribute": "1 - p * self.keep",
    "module-constant": "1 - p * KEEP",
    "inline": "1 - p * ({keep})",
    "reversed": "1.0 - KEEP * p",
}


def _scan(tmp_path: Path, expression: str, keep: str) -> Finding:
    path = tmp_path / "model.py"
    path.write_text(MODEL.format(keep=keep, expression=expression.format(keep=keep)))
    errors = [f for f in scan_file(str(path), verify=False).findings if f.is_error]
    assert len(errors) == 1, [f.message for f in errors]
    return errors[0]


SHAPES = list(itertools.product(KEEPS, ("1 - 1e-5", "0.99999", "0.99995")))


@pytest.mark.parametrize("shape", SHAPES, ids=["-".join(s) for s in SHAPES])
def test_a_constant_that_is_one_in_fp16_is_named_with_both_values(
    shape: tuple[str, str], tmp_path: Path
) -> None:
    where, keep = shape
    finding = _scan(tmp_path, KEEPS[where], keep)
    value = eval(keep)  # the number as Python holds it: 0.99999 for 1 - 1e-5
    assert finding.code == "NH202"
    assert finding.upstream is not None and finding.upstream.reason == "cancel"
    assert finding.kind is Kind.UNDERFLOW  # the FP32 difference 1e-5 is below 6.1e-5
    assert "subtracts values that are equal in float16" in finding.message
    assert f"the constant {value!r} at line 15 is 1 in float16" in finding.message
    assert "flushed" not in finding.message
    assert finding.fix is not None
    # finest first: the sigmoid and the ops after it upcast where they leave the Linear (no
    # region), then the region around the subtraction and its consumer
    titles = [f.title for f in (finding.fix, *finding.fix.alternatives)]
    assert titles[0].startswith("Compute torch.sigmoid, ")
    assert titles[0].endswith("(no region; the matmuls around stay in float16)")
    assert titles[1].startswith("Compute the subtraction and their consumer in FP32")


def test_a_saturated_probability_without_a_constant_is_a_cancellation(tmp_path: Path) -> None:
    finding = _scan(tmp_path, "1 - p", "1.0")
    assert finding.upstream is not None and finding.upstream.reason == "cancel"
    assert "(in FP32 their difference is 1.19e-07 or more); in FP32" in finding.message


def test_a_cancellation_fp16_could_hold_is_not_called_an_underflow(tmp_path: Path) -> None:
    """``2048 - x`` for x = 2047.5: FP16 steps by 1 there, so x is 2048 and the difference 0;
    in FP32 it is 0.5, far inside FP16's normal range."""
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent("""\
        import torch
        from torch import nn


        class Gap(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x):
                y = self.fc(x) + 2047.5
                return torch.log(2048 - y).sum()


        def build_model():
            m = Gap()
            with torch.no_grad():
                m.fc.weight.zero_()
                m.fc.bias.zero_()
            return m


        def sample_batch():
            return torch.ones(2, 4)
        """))
    errors = [f for f in scan_file(str(path), verify=False).findings if f.is_error]
    assert [(f.code, f.kind) for f in errors] == [("NH202", Kind.INF)]
    assert errors[0].upstream is not None and errors[0].upstream.reason == "cancel"
    assert "(in FP32 their difference is 0.5 or more)" in errors[0].message


@pytest.mark.parametrize(
    ("value", "fp16", "bf16"),
    [(1 - 1e-5, 1.0, 1.0), (0.9995, 0.99951171875, 1.0), (1e-10, 0.0, 1e-10), (3.0, 3.0, 3.0)],
)
def test_round_gives_the_formats_nearest_value(value: float, fp16: float, bf16: float) -> None:
    assert FP16.round(value) == fp16
    assert BF16.round(value) == pytest.approx(bf16, rel=1e-2)
