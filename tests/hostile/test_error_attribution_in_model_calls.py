"""Error attribution: an exception raised while the model runs is
the model's only when its code, or an op, hook or function it ran, raised it.

- A frame of Python's standard library (or of code Python generates, ``<string>``: a
  dataclass's ``__init__`` or frozen ``__setattr__``) only passes an exception on: before it
  decided as the model's, so a bug of ours that struck inside ``copy``, ``dataclasses`` ... was
  "the model raised"; and a model's error raised there pointed at the library's line.
- A model whose output is a dataclass with a field it never set (``field(init=False)``) is fine;
  the module tracker's walk of the output raised AttributeError on it (before an internal
  error; before, "the model raised").
- Guards: every function ``_PASSES_ON`` names exists, and the model's errors that come out of
  the autocast policy's kernel and the device alias are the model's (each fails without its
  entry)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

import nan_hunter.precision.gradients as gradients
from nan_hunter.api import scan
from nan_hunter.errors import UserCodeError


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_our_bug_inside_a_standard_library_call_is_not_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the gradient log calls copy.deepcopy(dest, data, rounded): AttributeError inside copy.py
    monkeypatch.setattr(gradients, "_fill_row", copy.deepcopy)
    torch.manual_seed(0)
    with pytest.raises(AttributeError) as raised:
        scan(_Model(), torch.randn(4, 8))
    assert not isinstance(raised.value, UserCodeError)


def test_the_models_error_inside_a_standard_library_call_is_the_models() -> None:
    class Decodes(_Model):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            dataclasses.replace(self.fc)  # TypeError raised in dataclasses.py
            return self.fc(x)

    torch.manual_seed(0)
    with pytest.raises(UserCodeError, match=r"the model raised TypeError during forward") as raised:
        scan(Decodes(), torch.randn(4, 8))
    # the model's line, not dataclasses.py's (before, a standard-library frame was the user's)
    assert (raised.value.user_frame or "").startswith(f"{__file__}:")


def test_code_python_generates_passes_the_models_error_on() -> None:
    """A frozen dataclass's ``__setattr__`` (``<string>``) raising in the model's forward."""

    @dataclasses.dataclass(frozen=True)
    class Config:
        width: int = 8

    class Reconfigures(_Model):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Config().width = 4  # type: ignore[misc]
            return self.fc(x)

    torch.manual_seed(0)
    with pytest.raises(UserCodeError, match=r"the model raised FrozenInstanceError"):
        scan(Reconfigures(), torch.randn(4, 8))


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    attentions: torch.Tensor = dataclasses.field(init=False)  # set only when asked for


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> _Out:
        return _Out(self.fc(x))


class _ReturnsADataclass(nn.Module):
    def __init__(self, whole: bool) -> None:
        super().__init__()
        self.head = _Head()
        self.whole = whole

    def forward(self, x: torch.Tensor) -> object:
        out = self.head(x)
        return out if self.whole else out.logits


@pytest.mark.parametrize("whole", [False, True])
def test_a_dataclass_output_with_a_field_never_set_scans(whole: bool) -> None:
    """``whole``: the model's own output (the default loss walks it too)."""
    torch.manual_seed(0)
    model, x = _ReturnsADataclass(whole), torch.randn(4, 8)
    report = scan(model, x)
    assert report.status == "clean"
    assert report.loss_scale == scan(model.head.fc, x).loss_scale


def test_every_function_that_passes_a_call_on_exists() -> None:
    """``_PASSES_ON`` names functions by file and name: a renamed or moved one would turn the
    model's errors that come out of it into internal errors, silently."""
    import ast
    from pathlib import Path

    import nan_hunter
    from nan_hunter.blame import _PASSES_ON

    root = Path(nan_hunter.__file__).parent
    for relative, name in sorted(_PASSES_ON):
        tree = ast.parse((root / relative).read_text(encoding="utf-8"))
        names = {
            node.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        if any(isinstance(node, ast.Lambda) for node in ast.walk(tree)):
            names.add("<lambda>")
        assert name in names, f"{relative} defines no {name}"


class _PolicyShapeError(_Model):
    """A shape error in an op CUDA's autocast policy casts (``mm``, in the policy's kernel; with
    real FP16 numerics, no emulation below it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(self.fc(x), torch.ones(3, 3))


class _AliasedAutocastError(_Model):
    """A bad device type given to ``torch.autocast`` (nan-hunter aliases "cuda" on a CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cdua"):
            return self.fc(x)


@pytest.mark.parametrize(
    ("model", "kind"),
    [(_PolicyShapeError, "RuntimeError"), (_AliasedAutocastError, "RuntimeError")],
    ids=["policy-kernel", "device-alias"],
)
def test_the_models_error_through_our_kernels_is_the_models(
    model: type[nn.Module], kind: str
) -> None:
    torch.manual_seed(0)
    with pytest.raises(UserCodeError, match=f"the model raised {kind} during forward"):
        scan(model(), torch.randn(4, 8), numerics="real")
