"""The reproduction bundle ``nan-hunter run`` saves at a problem step, written and read back in
this process (``tests/test_run_repro.py`` re-runs one with ``scan`` in a fresh process)."""

from __future__ import annotations

import enum
import runpy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from nan_hunter.core.safe_write import WriteError, write_new_folder
from nan_hunter.engine.pass_state import rng_state
from nan_hunter.findings import ReproBundle
from nan_hunter.project.config import Settings
from nan_hunter.training.repro import ReproSource, plan_bundle, write_bundle
from nan_hunter.training.rerun import ModelCall, StepPrecision


class Act(enum.Enum):
    GELU = "gelu"
    RELU = "relu"


@dataclass
class Config:
    width: int
    act: Act
    scale: float


class Block(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.width, config.width)
        self.act = F.gelu
        self.register_buffer("offset", torch.linspace(0, 1, config.width), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) * self.config.scale + self.offset


class Tied(nn.Module):
    """Constructor arguments, a config object, an enum, a function attribute, a non-persistent
    buffer, a tied weight, a shared submodule, and a lambda (which is left out)."""

    def __init__(self, width: int, config: Config) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width, bias=False)
        self.block = Block(config)
        self.again = self.block
        self.head = nn.Linear(width, width, bias=False)
        self.head.weight = self.embed.weight
        self.hook = lambda x: x

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                temperature: float = 1.0) -> torch.Tensor:
        h = self.again(self.block(self.embed(x)))
        if mask is not None:
            h = h * mask
        return self.head(h) / temperature


def _source(tmp_path: Path, kwargs: bool = False) -> tuple[ReproSource, torch.Tensor]:
    torch.manual_seed(0)
    model = Tied(6, Config(6, Act.GELU, 0.5))
    x, mask = torch.randn(3, 6), torch.ones(3, 6)
    args, named = ((x,), {"mask": mask, "temperature": 2.0}) if kwargs else ((x, mask), {})
    precision = StepPrecision.now(model, args)
    call = ModelCall(model, args, named, precision, rng=rng_state())
    out = model(*args, **named)
    call.watch_outputs(out)
    (out * 3).sum().backward()
    source = ReproSource.of(7, model, call, 1024.0, Settings(), frozenset())
    return source, out.detach()


def test_a_bundle_rebuilds_the_model_and_its_call_without_its_init(tmp_path: Path) -> None:
    source, out = _source(tmp_path)
    bundle = write_bundle(source, None, 1, tmp_path)
    folder = tmp_path / "nan-hunter-repro-step7"
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["batch.pt", "grads.pt", "model.py", "nan-hunter.yaml", "state.pt",
                     "weights.pt"]
    assert bundle == ReproBundle(
        str(folder), sum(p.stat().st_size for p in folder.iterdir()), written=True,
        note="left out (not plain data; edit build_model() if the forward needs them): "
             "Tied.hook (a function)",
    )
    made = runpy.run_path(str(folder / "model.py"))
    model, batch = made["build_model"](), made["sample_batch"]()
    assert type(model) is Tied and type(model.block.config) is Config
    assert model.block.config == Config(6, Act.GELU, 0.5) and model.block.act is F.gelu
    assert model.again is model.block and model.head.weight is model.embed.weight
    assert list(model.state_dict()) == list(source.module.state_dict())
    assert not hasattr(model, "hook")
    assert isinstance(batch, tuple) and len(batch) == 2
    assert torch.equal(model(*batch), out)  # the same weights, inputs and buffer
    # the output gradient drives the backward: d(loss)/d(out) is the real one over the scale
    again = model(*batch).requires_grad_()
    again.retain_grad()
    made["loss_fn"](again, batch).backward()
    assert again.grad is not None and torch.equal(again.grad, torch.full((3, 6), 3 / 1024))
    for name in ("weights.pt", "batch.pt", "grads.pt", "state.pt"):
        torch.load(folder / name, weights_only=True)  # safe to load
    assert (folder / "nan-hunter.yaml").read_text().splitlines()[2:] == [
        "dtype: float32", "mode: half", "device: cpu", "policy: cuda", "numerics: emulated",
        "grad_scale: null",
    ]


def test_the_batch_file_is_a_tuple_or_the_calls_inputs_by_name(tmp_path: Path) -> None:
    source, _ = _source(tmp_path, kwargs=True)
    files = dict(plan_bundle(source, tmp_path).files)
    batch = files["batch.pt"]
    assert sorted(batch) == ["mask", "temperature", "x"] and batch["temperature"] == 2.0


def test_the_rng_is_set_to_the_state_the_call_started_in(tmp_path: Path) -> None:
    source, _ = _source(tmp_path)
    assert source.call.rng is not None
    torch.random.set_rng_state(source.call.rng[0])
    first = torch.rand(3)  # what the step's forward would have drawn first
    torch.rand(5)
    write_bundle(source, None, 1, tmp_path)
    made = runpy.run_path(str(tmp_path / "nan-hunter-repro-step7" / "model.py"))
    made["sample_batch"]()
    assert torch.equal(torch.rand(3), first)


def test_over_the_cap_nothing_is_written_and_the_size_is_said(tmp_path: Path) -> None:
    source, _ = _source(tmp_path)
    bundle = write_bundle(source, None, 0.001, tmp_path)
    assert not bundle.written and list(tmp_path.iterdir()) == []
    # floats: weights 2*6*6 + 6 (the head's tied to the embedding's), the non-persistent
    # buffer 6, the batch 2*3*6, the output gradient 3*6; the RNG state 5056 bytes
    assert bundle.size_bytes == 4 * (78 + 6 + 36 + 18) + 5056
    assert bundle.note == (
        "it would hold 5 KB, over --repro-max-mb 0.001: nothing written"
    )


def test_a_default_folder_never_takes_a_name_that_exists(tmp_path: Path) -> None:
    source, _ = _source(tmp_path)
    (tmp_path / "nan-hunter-repro-step7").mkdir()
    (tmp_path / "nan-hunter-repro-step7" / "keep").write_text("mine")
    first = write_bundle(source, None, 1, tmp_path)
    second = write_bundle(source, None, 1, tmp_path)
    assert [Path(first.path).name, Path(second.path).name] == [
        "nan-hunter-repro-step7-1", "nan-hunter-repro-step7-2"]
    assert (tmp_path / "nan-hunter-repro-step7" / "keep").read_text() == "mine"


def test_a_folder_that_holds_something_is_never_written_into(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "a").write_text("x")
    with pytest.raises(WriteError, match="exists and is not an empty folder"):
        write_new_folder(tmp_path / "taken", [("b", lambda out: None)])
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "taken"]


def test_a_failed_write_leaves_no_folder_behind(tmp_path: Path) -> None:
    def fail(out: object) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(WriteError, match="no space left on the device; nothing was written"):
        write_new_folder(tmp_path / "new", [("a", lambda out: None), ("b", fail)])
    assert list(tmp_path.iterdir()) == []
