"""Error attribution: a function that passes a call on (``blame._PASSES_ON``) decides
"the model's" only at the lines that pass the call on (marked ``PASSES_ON_MARK``); an exception
from any other of its lines is a bug of ours (before it read "the model raised ...")."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import nan_hunter
import nan_hunter.precision.emulation as emulation
from nan_hunter.api import scan
from nan_hunter.blame import _PASSES_ON, PASSES_ON_MARK, _passes_on
from nan_hunter.errors import UserCodeError


def test_our_bug_on_a_line_of_the_emulation_itself_is_not_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # sys._getframe(1).f_code in __torch_dispatch__'s own line, in the backward: no deeper frame
    monkeypatch.setattr(emulation, "sys", SimpleNamespace(_getframe=math.sqrt))
    torch.manual_seed(0)
    with pytest.raises(AttributeError, match="'float' object has no attribute 'f_code'") as raised:
        scan(nn.Linear(8, 2), torch.randn(4, 8))
    assert not isinstance(raised.value, UserCodeError)


def test_the_models_error_through_the_emulation_stays_the_models() -> None:
    class Mismatched(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) @ torch.ones(2, 2)  # an FP16 mm: emulated, then a shape error

    torch.manual_seed(0)
    with pytest.raises(UserCodeError, match=r"the model raised RuntimeError during forward"):
        scan(Mismatched(), torch.randn(4, 8))


def test_every_function_that_passes_a_call_on_marks_its_calls() -> None:
    """A pass-on function with no marked line would make every error out of it ours."""
    root = Path(nan_hunter.__file__).parent
    for relative, name in sorted(_PASSES_ON):
        source = (root / relative).read_text(encoding="utf-8")
        lines = source.splitlines()
        marked = [
            node
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.Lambda))
            and getattr(node, "name", "<lambda>") == name
            and any(
                lines[i - 1].rstrip().endswith(PASSES_ON_MARK)
                for i in range(node.lineno, (node.end_lineno or node.lineno) + 1)
            )
        ]
        assert marked, f"no line of {relative}:{name} ends with {PASSES_ON_MARK!r}"


def test_without_the_source_every_line_passes_the_call_on(tmp_path: Path) -> None:
    """An install without .py files: as before the marks, the model's."""
    assert _passes_on(str(tmp_path / "gone.py"), 3)
    assert not _passes_on(__file__, 1)
    import nan_hunter.runner as runner

    assert _passes_on(runner.__file__, _marked_line())


def _marked_line() -> int:
    import nan_hunter.runner as runner

    lines = Path(runner.__file__).read_text(encoding="utf-8").splitlines()
    return next(
        i for i, line in enumerate(lines, 1)
        if line.rstrip().endswith(PASSES_ON_MARK) and "model(" in line
    )
