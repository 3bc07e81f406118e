"""``--weights`` with a checkpoint saved from the wrapped model (DDP or DataParallel:
``module.`` before every key; ``torch.compile``: ``_orig_mod.``) while ``build_model()``
returns the plain module, as training scripts save and model files build. The README's promise
covered only the other way round (a wrapped model, a plain state_dict); before this way
ended in "does not fit the model: ... Missing key(s) ... fc1.weight" (exit 2). Now the
wrapper's prefix is taken off when the keys then fit exactly; keys that fit neither way are
still refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.project.loader import load_target
from tests.conftest import EXAMPLES


def test_a_checkpoint_of_the_wrapped_model_loads_into_the_plain_one(work: Path) -> None:
    shutil.copy(EXAMPLES / "clean_mlp.py", work / "model.py")
    plain = load_target("model.py").model
    state = {k: v + 0.25 if v.is_floating_point() else v for k, v in plain.state_dict().items()}
    torch.save({f"module._orig_mod.{k}": v for k, v in state.items()}, work / "ddp.pt")
    loaded = load_target("model.py", weights=work / "ddp.pt").model
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    result = CliRunner().invoke(
        app, ["scan", "model.py", "-q", "--weights", "ddp.pt", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "clean"
    torch.save({f"module.{k}": v for k, v in list(state.items())[:-1]}, work / "part.pt")
    result = CliRunner().invoke(app, ["scan", "model.py", "-q", "--weights", "part.pt"])
    assert result.exit_code == 2
    assert "weights file part.pt does not fit the model" in result.stderr
