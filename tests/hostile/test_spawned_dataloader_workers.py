"""``sample_batch()`` reads its batch through a ``DataLoader`` whose workers start with the spawn
or forkserver method (the default on macOS, and on Linux from Python 3.14). Before the model
file was imported under an internal name (``_nan_hunter_user_model_1d814b``) that no other
process can import, so each worker failed to unpickle the dataset ("No module named
'_nan_hunter_user_...'") and the scan ended with "DataLoader worker ... exited unexpectedly"
(exit 2). Now the scan process imports the file under its own name, as ``import model`` would
do, whenever that name is free (the Python API, in the caller's process, keeps the internal
name)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.project import loader
from nan_hunter.project.loader import import_user_module

pytestmark = pytest.mark.slow  # DataLoader workers started by spawn

MODEL = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Toy(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((4,), float(i))


def build_model():
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def sample_batch():
    loader = DataLoader(Toy(), batch_size=8, num_workers=1, multiprocessing_context={context!r})
    return next(iter(loader))
"""


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_batch_from_spawned_dataloader_workers(context: str, work: Path) -> None:
    (work / "model.py").write_text(MODEL.format(context=context))
    result = CliRunner().invoke(app, ["scan", "model.py", "-q", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "clean"


def test_the_module_name_is_the_files_own_unless_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "api_name.py"
    path.write_text("VALUE = 1\n")
    # the caller's process (the Python API): an internal name, its own "import x" stays its own
    assert import_user_module(str(path)).__name__.startswith("_nan_hunter_user_api_name")
    monkeypatch.setattr(loader, "_OWN_NAMES", True)  # the scan process (nan_hunter.process.worker)
    for stem in ("free_name", "json", "my-model", "yaml", "test", "_tracemalloc"):
        path = tmp_path / f"{stem}.py"
        path.write_text("VALUE = 1\n")
        module = import_user_module(str(path))
        assert module.__file__ == str(path) and module.VALUE == 1
        if stem == "free_name":
            assert module.__name__ == stem
        else:  # an imported or importable module's name, or not an identifier: internal
            assert module.__name__.startswith(f"_nan_hunter_user_{stem}_")
            assert json.__name__ == "json"
    # Not imported yet, but importable (the standard library's test package, an installed
    # package): the model file must not shadow it for later imports in the scan process.
    assert "test" not in sys.modules or sys.modules["test"].__file__ != str(tmp_path / "test.py")
    yaml_module = sys.modules.get("yaml")
    assert yaml_module is None or yaml_module.__file__ != str(tmp_path / "yaml.py")
