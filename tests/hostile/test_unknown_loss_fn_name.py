"""``--loss-fn NAME`` that the model file does not define (a typo). Before, the
scan went on silently with the default loss (the sum of the outputs' means) and exited 0: a CI
check that passed on a loss nobody asked for. Now a name given on the command line must exist,
like ``--model-fn`` and ``--batch-fn``; the default name ``loss_fn`` stays optional."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.errors import LoadError
from nan_hunter.project.loader import Names, load_target

MODEL = """\
import torch
from torch import nn


def build_model():
    torch.manual_seed(0)
    return nn.Linear(4, 4)


def sample_batch():
    torch.manual_seed(0)
    return torch.randn(2, 4)


def my_loss(output, batch):
    return (output * 1e5).pow(2).sum()
"""


def test_a_loss_function_that_is_not_defined_is_an_error(work: Path) -> None:
    (work / "model.py").write_text(MODEL)
    result = CliRunner().invoke(app, ["scan", "model.py", "--loss-fn", "my_losss", "-q"])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        "nan-hunter: error: model.py defines no my_losss(); define it or name another "
        "function with --loss-fn\n"
    )


def test_a_named_loss_function_is_used_and_the_default_name_is_optional(work: Path) -> None:
    (work / "model.py").write_text(MODEL)
    named = load_target("model.py", Names(loss_fn="my_loss"))
    assert named.loss_fn is not None and named.loss_fn.__name__ == "my_loss"
    assert load_target("model.py").loss_fn is None  # no loss_fn(): the default loss
    with pytest.raises(LoadError, match=r"defines no nope\(\)"):
        load_target("model.py", Names(loss_fn="nope"))
    result = CliRunner().invoke(
        app, ["scan", "model.py", "--loss-fn", "my_loss", "-q", "--format", "json"]
    )
    assert result.exit_code == 1, result.stderr  # (x * 1e5) ** 2 overflows FP16
    assert json.loads(result.stdout)["status"] == "findings"
