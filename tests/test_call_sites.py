"""``nan_hunter.trace.call_sites``: op names, and attribution of traced ops to their lines."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nan_hunter.precision.formats import FP16
from nan_hunter.trace.call_sites import frame_origin, op_display_name
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.modules import ModuleTracker
from nan_hunter.trace.tracer import OpTracer

THIS_FILE = Path(__file__).resolve()


def _marker_line(marker: str) -> int:
    """1-based line of this file whose code ends with ``# <marker>``."""
    lines = THIS_FILE.read_text(encoding="utf-8").splitlines()
    hits = [i for i, line in enumerate(lines, start=1) if line.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def _marker_code(marker: str) -> str:
    line = THIS_FILE.read_text(encoding="utf-8").splitlines()[_marker_line(marker) - 1]
    return line.strip()


# -- op_display_name --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("func", "name"),
    [
        (torch.matmul, "torch.matmul"),
        (torch.add, "torch.add"),
        (torch.einsum, "torch.einsum"),
        (F.linear, "torch.nn.functional.linear"),
        (F.layer_norm, "torch.nn.functional.layer_norm"),
        (F.softmax, "torch.nn.functional.softmax"),
        (torch.Tensor.softmax, "Tensor.softmax"),
        (torch.Tensor.add, "Tensor.add"),
        (torch.Tensor.__mul__, "Tensor.__mul__"),
        (torch.Tensor.__rpow__, "Tensor.__rpow__"),
        (torch.linalg.inv, "torch.linalg.inv"),
        (torch.fft.fft, "torch.fft.fft"),
        (torch.special.erf, "torch.special.erf"),
    ],
)
def test_op_display_name(func: object, name: str) -> None:
    assert op_display_name(func) == name  # type: ignore[arg-type]


def test_op_display_name_of_property() -> None:
    assert op_display_name(torch.Tensor.T.__get__) == "Tensor.T"  # type: ignore[attr-defined]


def test_frame_origin() -> None:
    assert frame_origin(torch.nn.modules.linear.__file__) == "torch"
    assert frame_origin("<frozen importlib._bootstrap>") == "torch"
    assert frame_origin(str(Path(op_display_name.__code__.co_filename))) == "own"
    assert frame_origin(str(THIS_FILE)) == "user"


# -- end to end through the tracer ------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.block = nn.Sequential(nn.Linear(2, 2))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c = a * b  # <mul>
        d = a @ b  # <matmul>
        e = a.mul(b)  # <method-mul>
        f = 2 ** a  # <rpow>
        g = -a  # <neg>
        h = a / 3.0  # <div>
        x = c.clone()  # <clone>
        x *= 2  # <imul>
        i = torch.matmul(d, b)  # <torch-matmul>
        j = self.fc(i)  # <fc>
        k = x + 1.5  # <add>
        m = self.block(j)  # <block>
        return c, d, e, f, g, h, x, i, j, k, m


def _trace(model: nn.Module, *inputs: torch.Tensor) -> list[OpEvent]:
    with ModuleTracker(model) as modules, OpTracer(modules, FP16) as tracer:
        model(*inputs)
    return tracer.events


@pytest.fixture(scope="module")
def events() -> list[OpEvent]:
    torch.manual_seed(0)
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[0.5, -1.0], [2.0, 0.25]])
    return _trace(_Net(), a, b)


EXPECTED = [
    # (marker, op, module, producers, scalars)
    ("mul", "Tensor.__mul__", "", (None, None), ()),
    ("matmul", "Tensor.__matmul__", "", (None, None), ()),
    ("method-mul", "Tensor.mul", "", (None, None), ()),
    ("rpow", None, "", (None,), ()),  # op name: see test_reflected_operator_names
    ("neg", "Tensor.__neg__", "", (None,), ()),
    ("div", "Tensor.__truediv__", "", (None,), (3.0,)),
    ("clone", "Tensor.clone", "", (0,), ()),
    ("imul", "Tensor.__imul__", "", (6,), ()),
    ("torch-matmul", "torch.matmul", "", (1, None), ()),
    ("fc", "torch.nn.functional.linear", "fc", (8, None, None), ()),
    ("add", "Tensor.__add__", "", (7,), (1.5,)),
    ("block", "torch.nn.functional.linear", "block.0", (9, None, None), ()),
]


def test_one_event_per_op_in_order(events: list[OpEvent]) -> None:
    assert [e.index for e in events] == list(range(len(EXPECTED)))


@pytest.mark.parametrize(
    ("position", "marker", "op", "module", "producers", "scalars"),
    [(i, *row) for i, row in enumerate(EXPECTED)],
    ids=[row[0] for row in EXPECTED],
)
def test_event_attribution(
    events: list[OpEvent],
    position: int,
    marker: str,
    op: str | None,
    module: str,
    producers: tuple[int | None, ...],
    scalars: tuple[float, ...],
) -> None:
    event = events[position]
    if op is not None:
        assert event.op == op
    assert event.module == module
    assert event.in_user_code is True
    assert event.location is not None
    assert Path(event.location.file).resolve() == THIS_FILE
    assert event.location.line == _marker_line(marker)
    assert event.location.code == _marker_code(marker)
    assert event.producers == producers
    assert event.scalars == scalars
    assert event.in_loss is False
    assert event.key == (event.op, event.location.file, event.location.line, 1)


def test_event_statistics(events: list[OpEvent]) -> None:
    mul = events[0]
    assert len(mul.inputs) == 2
    assert (mul.inputs[0].min, mul.inputs[0].max) == (1.0, 4.0)
    assert (mul.outputs[0].min, mul.outputs[0].max) == (-2.0, 6.0)  # [[0.5, -2], [6, 1]]
    div = events[5]
    assert div.outputs[0].max == pytest.approx(4.0 / 3.0)
    imul = events[7]
    assert imul.outputs[0].min == -4.0
    assert imul.outputs[0].max == 12.0
    assert events[10].inputs[0].max == 12.0  # stats of x after the in-place op, not before


def test_location_code_is_source_text(events: list[OpEvent]) -> None:
    assert events[1].location is not None
    assert events[1].location.code == "d = a @ b  # <matmul>"
    assert events[5].location is not None
    assert events[5].location.code == "h = a / 3.0  # <div>"


def test_second_call_counts_occurrences() -> None:
    model = _Net()
    a = torch.ones(2, 2)
    with ModuleTracker(model) as modules, OpTracer(modules, FP16) as tracer:
        model(a, a)
        model(a, a)
    first, second = tracer.events[0], tracer.events[len(EXPECTED)]
    assert first.op == second.op == "Tensor.__mul__"
    assert first.key[:3] == second.key[:3]
    assert (first.key[3], second.key[3]) == (1, 2)
    assert second.producers == (None, None)


def _rpow(a: torch.Tensor) -> torch.Tensor:
    return 2 ** a  # <rpow-alone>


def _rsub(a: torch.Tensor) -> torch.Tensor:
    return 1 - a  # <rsub-alone>


@pytest.mark.parametrize(
    ("func", "marker", "op"),
    [(_rpow, "rpow-alone", "Tensor.__rpow__"), (_rsub, "rsub-alone", "Tensor.__rsub__")],
    ids=["rpow", "rsub"],
)
def test_reflected_operator_names(func: object, marker: str, op: str) -> None:
    model = nn.Identity()
    a = torch.ones(2)
    with ModuleTracker(model) as modules, OpTracer(modules, FP16) as tracer:
        func(a)  # type: ignore[operator]
    assert len(tracer.events) == 1
    event = tracer.events[0]
    assert event.location is not None
    assert event.location.line == _marker_line(marker)
    assert event.op == op


def test_rpow_in_forward_is_attributed_to_its_line(events: list[OpEvent]) -> None:
    event = events[3]
    assert event.op == "Tensor.__rpow__"
    assert event.outputs[0].min == 2.0
    assert event.outputs[0].max == 16.0
