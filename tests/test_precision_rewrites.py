"""The rewrites of a precision finding's cause (``nan_hunter.fixes.precision_rewrites``): the
exact text they write, and where they refuse."""

from __future__ import annotations

import pytest

from nan_hunter.fixes.precision_rewrites import (
    dropped_cast,
    fp32_accumulator,
    fp32_integers,
    stable_form,
)

SOURCE = """\
import torch


def f(x, h, pos, p, theta, kw):
    a = 1 - torch.cos(theta)
    b = torch.exp(x) - 1
    c = torch.log(1 + x * 2)
    d = torch.log(1 - x)
    e = p.cumsum(1)
    g = torch.sum(p, dim=1, dtype=torch.bfloat16)
    k = p.sum()
    q = torch.arange(h.shape[1], dtype=h.dtype)
    r = pos.to(h.dtype)
    s = pos.half()
    t = 1 - theta.cos()
    u = p.sum(**kw)
    v = torch.arange(h.shape[1])
    w = torch.log(2 + x)
    y = (
        p.cumsum(
            1
        )
    )
"""


def _line(text: str | None, line: int) -> str:
    assert text is not None
    return text.splitlines()[line - 1].strip()


@pytest.mark.parametrize(("line", "op", "expected"), [
    (5, "rsub", ("a = 2 * torch.sin(theta / 2) ** 2", "1 - cos(x) as 2 * sin(x / 2) ** 2")),
    (6, "sub", ("b = torch.expm1(x)", "exp(x) - 1 as expm1(x)")),
    (7, "log", ("c = torch.log1p(x * 2)", "log(1 + x) as log1p(x)")),
    (8, "log", ("d = torch.log1p(-x)", "log(1 - x) as log1p(-x)")),
    (15, "rsub", ("t = 2 * torch.sin(theta / 2) ** 2", "1 - cos(x) as 2 * sin(x / 2) ** 2")),
])
def test_stable_forms(line: int, op: str, expected: tuple[str, str]) -> None:
    result = stable_form(SOURCE, line, op)
    assert result is not None
    assert (_line(result[0], line), result[1]) == expected


@pytest.mark.parametrize(("line", "op"), [(18, "log"), (9, "sub"), (5, "log")])
def test_no_stable_form_where_the_expression_is_another(line: int, op: str) -> None:
    assert stable_form(SOURCE, line, op) is None


@pytest.mark.parametrize(("line", "op", "expected"), [
    (9, "cumsum", "e = p.cumsum(1, dtype=torch.float32)"),
    (10, "sum", "g = torch.sum(p, dim=1, dtype=torch.float32)"),
    (11, "sum", "k = p.sum(dtype=torch.float32)"),
])
def test_fp32_accumulator(line: int, op: str, expected: str) -> None:
    assert _line(fp32_accumulator(SOURCE, line, op), line) == expected


def test_fp32_accumulator_on_a_call_over_several_lines() -> None:
    new = fp32_accumulator(SOURCE, 20, "cumsum")
    assert new is not None
    assert new.splitlines()[19:22] == [
        "        p.cumsum(", "            1, dtype=torch.float32", "        )"
    ]


def test_no_accumulator_rewrite_behind_kwargs_or_for_another_op() -> None:
    assert fp32_accumulator(SOURCE, 16, "sum") is None  # **kw may hold a dtype
    assert fp32_accumulator(SOURCE, 9, "mean") is None


@pytest.mark.parametrize(("line", "op", "expected"), [
    (12, "arange", "q = torch.arange(h.shape[1], dtype=torch.float32)"),
    (13, "to", "r = pos.to(torch.float32)"),
    (14, "half", "s = pos.float()"),
])
def test_fp32_integers(line: int, op: str, expected: str) -> None:
    assert _line(fp32_integers(SOURCE, line, op), line) == expected


def test_no_integer_rewrite_for_a_factory_without_dtype() -> None:
    assert fp32_integers(SOURCE, 17, "arange") is None  # already int64: not the one rounded


def test_dropped_cast() -> None:
    assert _line(dropped_cast(SOURCE, 13, "to"), 13) == "r = pos"
    assert _line(dropped_cast(SOURCE, 14, "half"), 14) == "s = pos"


def test_nothing_without_torch_bound_at_the_top() -> None:
    source = SOURCE.replace("import torch\n", "import torch as th\n")
    assert fp32_accumulator(source, 9, "cumsum") is None
    assert stable_form(source, 5, "rsub") is None
