"""A custom ``autograd.Function`` whose own ``backward`` overflows FP16: the finding names the
Function at its ``def backward`` line (not the traced op that receives its inf next), and the
fix runs the Function in FP32 with ``torch.amp.custom_fwd``/``custom_bwd``, verified by re-scan.

The models are generated: the decorators above the methods, the file's line endings, where the
Function is defined (the model file or a sibling module) and which module calls it."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest

from nan_hunter.api import scan_file
from nan_hunter.findings import Applicability, Finding, Report
from nan_hunter.fixes.rewrites import custom_function_fp32
from nan_hunter.project.config import load_settings

FUNCTION = '''\
class InverseSquare(torch.autograd.Function):
    """x / (x**2 + 1), its backward written by hand; steep in between."""

{forward_decorators}    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x / (x * x + 1.0)

{backward_decorators}    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 1e5 / (x * x + 1e-2) * 1e-3
'''
"""In FP16 the backward's ``grad * 1e5 / 0.0116`` is inf; in FP32 it is 1.08e6 on the way to a
gradient of 1078."""

DECORATORS = {
    "staticmethod": ("    @staticmethod\n", "    @staticmethod\n"),
    "once-differentiable": (
        "    @staticmethod\n",
        "    @staticmethod\n    @torch.autograd.function.once_differentiable\n",
    ),
}

MODEL = """\
import torch
from torch import nn
{import_function}

{function}

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return {block_return}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return {net_return}


def build_model():
    torch.manual_seed(0)
    m = Net()
    with torch.no_grad():
        m.block.fc.weight.fill_(0.01)
        m.block.fc.bias.zero_()
    return m


def sample_batch():
    return torch.ones(2, 4)
"""


def _write(folder: Path, decorators: str, ending: str, where: str, caller: str) -> Path:
    forward, backward = DECORATORS[decorators]
    function = FUNCTION.format(forward_decorators=forward, backward_decorators=backward)
    in_block = caller == "submodule"
    model = MODEL.format(
        import_function="from ops import InverseSquare\n" if where == "sibling" else "",
        function=function if where == "model" else "",
        block_return="InverseSquare.apply(self.fc(x))" if in_block else "self.fc(x)",
        net_return="self.block(x)" if in_block else "InverseSquare.apply(self.block(x))",
    )
    files = {"model.py": model}
    if where == "sibling":
        files["ops.py"] = f"import torch\n\n\n{function}"
    for name, text in files.items():
        (folder / name).write_bytes(text.replace("\n", ending).encode())
    return folder / ("ops.py" if where == "sibling" else "model.py")


def _backward_line(path: Path) -> int:
    lines = path.read_bytes().decode().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "def backward" in line)


def _error(report: Report) -> Finding:
    errors = [f for f in report.findings if f.is_error]
    assert len(errors) == 1, [f.message for f in report.findings]
    return errors[0]


SHAPES = list(itertools.product(
    DECORATORS, ("\n", "\r\n"), ("model", "sibling"), ("root", "submodule")
))
"""16 models: decorators x line endings x where the Function lives x who calls it."""


@pytest.mark.parametrize(
    "shape", SHAPES,
    ids=["-".join((d, "crlf" if e == "\r\n" else "lf", w, c)) for d, e, w, c in SHAPES],
)
def test_a_custom_function_backward_is_named_and_run_in_fp32(
    shape: tuple[str, str, str, str], tmp_path: Path
) -> None:
    holder = _write(tmp_path, *shape)
    finding = _error(scan_file(str(tmp_path / "model.py")))
    assert (finding.code, finding.op) == ("NH401", "InverseSquare.apply")
    assert finding.location is not None
    assert Path(finding.location.file).resolve() == holder.resolve()
    assert finding.location.line == _backward_line(holder)
    assert "the custom autograd.Function InverseSquare (its own backward)" in finding.message
    assert finding.module == ("block" if shape[3] == "submodule" else "")
    assert finding.fix is not None and finding.fix.verified is True
    assert finding.fix.applicability is Applicability.SAFE
    diff = finding.fix.diff or ""
    assert '+    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)' in diff
    assert '+    @torch.amp.custom_bwd(device_type="cuda")' in diff
    assert b"custom_fwd" not in holder.read_bytes()  # nothing written without --fix


def test_in_half_mode_the_fix_is_advice_for_the_function(tmp_path: Path) -> None:
    _write(tmp_path, "staticmethod", "\n", "model", "root")
    settings = load_settings(overrides={"mode": "half"})
    finding = _error(scan_file(str(tmp_path / "model.py"), settings))
    assert finding.op == "InverseSquare.apply"
    assert finding.fix is not None
    assert finding.fix.applicability is Applicability.DISPLAY_ONLY
    assert finding.fix.title.startswith("Compute InverseSquare's forward and backward in FP32")


# --- the rewrite itself --------------------------------------------------------------------


def _source(body: str) -> str:
    return "import torch\n\n\n" + textwrap.dedent(body)


PLAIN = """\
class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2
"""


def test_the_rewrite_puts_each_decorator_right_above_its_def(tmp_path: Path) -> None:
    path = tmp_path / "f.py"
    path.write_text(_source(PLAIN))
    new = custom_function_fp32(path, 10, "cpu")
    assert new == _source(PLAIN).replace(
        "    def forward",
        '    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)\n    def forward',
    ).replace("    def backward", '    @torch.amp.custom_bwd(device_type="cpu")\n    def backward')


@pytest.mark.parametrize(
    ("name", "source", "line"),
    [
        ("already-decorated", PLAIN.replace(
            "    def forward", "    @torch.amp.custom_fwd(device_type='cuda')\n    def forward"
        ), 11),
        ("setup-context-style", PLAIN.replace(
            "    def forward(ctx, x)",
            "    def forward(x)"
        ).replace("        return x * 2\n", "        return x * 2\n\n"
                  "    @staticmethod\n    def setup_context(ctx, inputs, output):\n"
                  "        pass\n"), 14),
        ("not-the-backward-line", PLAIN, 9),
    ],
)
def test_the_rewrite_declines_what_it_cannot_make_safely(
    name: str, source: str, line: int, tmp_path: Path
) -> None:
    path = tmp_path / "f.py"
    path.write_text(_source(source))
    assert "def backward" in path.read_text().splitlines()[line - 1] or name.startswith("not")
    assert custom_function_fp32(path, line, "cuda") is None


def test_the_rewrite_needs_torch_bound_by_its_name(tmp_path: Path) -> None:
    path = tmp_path / "f.py"
    path.write_text(_source(PLAIN).replace("import torch", "import torch as th").replace(
        "torch.autograd", "th.autograd"))
    assert custom_function_fp32(path, 10, "cuda") is None
