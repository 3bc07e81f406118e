"""Under model.half(): the module holding the culprit kept in FP32 (its own ``_apply``), with its
inputs upcast and its results cast back; and the scan's half mode casting the model as
``model.half()`` does, so such a module is scanned as it would run."""

from __future__ import annotations

import textwrap
import types
from pathlib import Path

import pytest
import torch

from nan_hunter.api import scan, scan_file
from nan_hunter.findings import Applicability
from nan_hunter.fixes.module_region import build_kept_module_patch
from nan_hunter.project.config import load_settings
from tests.test_model_state import _assert_same, _snapshot

# --- the patch on generated method shapes ------------------------------------------------------

# Each body computes with the 1e-9 buffer ``eps`` (0 in FP16) and returns one tensor; the
# patched module must keep ``eps`` at 1e-9 under .half() and compute what the FP32 module does.
BODIES = {
    "one return": """\
        def forward(self, x):
            v = self.fc(x).pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(v + self.eps)
        """,
    "docstring and a bool mask": """\
        def forward(self, x, mask):
            \"\"\"Masked norm.\"\"\"
            v = self.fc(x).masked_fill(mask, 0.0).pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(v + self.eps)
        """,
    "returns in both branches": """\
        def forward(self, x, scale: float = 1.0):
            v = self.fc(x).pow(2).mean(-1, keepdim=True)
            if scale == 1.0:
                return x * torch.rsqrt(v + self.eps)
            else:
                return (
                    x * scale * torch.rsqrt(v + self.eps)
                )
        """,
    "a nested function's return left alone": """\
        def forward(self, x):
            def inner(t):
                return t.pow(2).mean(-1, keepdim=True)
            v = inner(self.fc(x))
            return x * torch.rsqrt(v + self.eps)
        """,
    "names result and entry_dtype taken": """\
        def forward(self, x):
            result = self.fc(x).pow(2).mean(-1, keepdim=True)
            entry_dtype = 3
            return x * torch.rsqrt(result + self.eps) * entry_dtype
        """,
    "a tuple returned": """\
        def forward(self, x):
            v = self.fc(x).pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(v + self.eps), v.argmax()
        """,
    "a decorated method": """\
        @torch.no_grad()
        def forward(self, x):
            v = self.fc(x).pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(v + self.eps)
        """,
}

MODULE = """\
import torch
from torch import nn


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("eps", torch.tensor(1e-9))

{body}
"""


def _module_source(body: str) -> str:
    return MODULE.format(body=textwrap.indent(textwrap.dedent(body), "    "))


def _load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def _patched(body: str, folder: Path) -> tuple[str, str]:
    """The module's source, and its source with the kept-module patch at its rsqrt line."""
    path = folder / "norm.py"
    original = _module_source(body)
    path.write_text(original, encoding="utf-8")
    line = next(i for i, text in enumerate(original.splitlines(), 1) if "rsqrt" in text)
    patch = build_kept_module_patch(path, line, relative_to=folder)
    assert patch is not None
    return original, patch.region.new_source


def _as_tuple(value: object) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _inputs(body: str, dtype: torch.dtype) -> tuple:
    torch.manual_seed(1)
    x = torch.randn(2, 8).to(dtype)
    return (x, torch.zeros(2, 8, dtype=torch.bool)) if "mask" in body else (x,)


@pytest.mark.parametrize("shape", BODIES, ids=list(BODIES))
def test_the_kept_module_stays_fp32_under_half_and_computes_as_before(
    shape: str, tmp_path: Path
) -> None:
    body = BODIES[shape]
    original, patched = _patched(body, tmp_path)
    before, after = _load(original, "before"), _load(patched, "after")
    torch.manual_seed(0)
    plain = before.Norm()
    kept = after.Norm()
    kept.load_state_dict(plain.state_dict())
    # FP32: the same computation, bit for bit
    for ours, theirs in zip(
        _as_tuple(kept(*_inputs(body, torch.float32))),
        _as_tuple(plain(*_inputs(body, torch.float32))), strict=True,
    ):
        assert torch.equal(ours, theirs)
    kept.half()
    assert {t.dtype for t in [*kept.parameters(), *kept.buffers()]} == {torch.float32}
    assert kept.eps.item() == pytest.approx(1e-9)
    out = kept(*_inputs(body, torch.float16))
    if isinstance(out, tuple):  # the floating tensors cast back, the index left as it is
        out, index = out
        assert index.dtype == torch.int64
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    plain.half()
    assert plain.eps.item() == 0.0  # what the patch is for


def test_the_kept_module_still_moves_and_goes_to_float64(tmp_path: Path) -> None:
    _, patched = _patched(BODIES["one return"], tmp_path)
    kept = _load(patched, "kept").Norm()
    kept.to("meta", torch.float16)
    assert kept.fc.weight.is_meta and kept.fc.weight.dtype == torch.float32
    kept = _load(patched, "kept").Norm().double()
    assert kept.eps.dtype == torch.float64
    assert kept.bfloat16().eps.dtype == torch.bfloat16  # kept against float16 only


NOT_MADE = {
    "a plain function": "def norm(x, eps):\n    return x * torch.rsqrt(x.pow(2).mean() + eps)\n",
    "a class with its own _apply": textwrap.dedent("""\
        class Norm(nn.Module):
            def _apply(self, fn, recurse=True):
                return super()._apply(fn, recurse)

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean() + 1e-9)
        """),
    "a return sharing its line": textwrap.dedent("""\
        class Norm(nn.Module):
            def forward(self, x):
                if x.numel() == 0: return x
                return x * torch.rsqrt(x.pow(2).mean() + 1e-9)
        """),
    "no tensor argument": textwrap.dedent("""\
        class Norm(nn.Module):
            def forward(self, n: int):
                v = self.weight * n
                return torch.rsqrt(v + 1e-9)
        """),
    "nothing returned": textwrap.dedent("""\
        class Norm(nn.Module):
            def forward(self, x):
                self.last = torch.rsqrt(x.pow(2).mean() + 1e-9)
        """),
}


@pytest.mark.parametrize("shape", NOT_MADE, ids=list(NOT_MADE))
def test_no_kept_module_patch_where_it_cannot_be_made(shape: str, tmp_path: Path) -> None:
    source = "import torch\nfrom torch import nn\n\n\n" + NOT_MADE[shape]
    path = tmp_path / "model.py"
    path.write_text(source, encoding="utf-8")
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "rsqrt" in text)
    assert build_kept_module_patch(path, line, relative_to=tmp_path) is None


# --- the scan casts the model as model.half() does ---------------------------------------------

KEPT_MODEL = """\
import torch
from torch import nn


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("eps", torch.tensor(1e-9))
        self.register_buffer("cap", torch.tensor(2e5))

{keep}
    def forward(self, x):
        entry = x.dtype
        x = x.to(self.fc.weight.dtype)  # as T5 does for its kept modules
        v = self.fc(x).pow(2).mean(-1, keepdim=True) * 1e-12
        return (x * torch.rsqrt(v + self.eps) * 1e-3).clamp(max=self.cap).to(entry)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = Norm()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.norm(x))


def build_model():
    torch.manual_seed(0)
    return Net()


def sample_batch():
    torch.manual_seed(0)
    return torch.randn(4, 8)
"""

KEEP = """\
    def _apply(self, fn, recurse=True):
        def keep_float32(t):
            cast = fn(t)
            if t.dtype == torch.float32 and cast.dtype == torch.float16:
                return t.to(cast.device)
            return cast
        return super()._apply(keep_float32, recurse)
"""


def test_half_mode_scans_a_module_that_keeps_itself_in_fp32_as_it_runs(tmp_path: Path) -> None:
    kept = tmp_path / "kept.py"
    kept.write_text(KEPT_MODEL.format(keep=KEEP), encoding="utf-8")
    plain = tmp_path / "plain.py"
    plain.write_text(KEPT_MODEL.format(keep=""), encoding="utf-8")
    half = load_settings(overrides={"mode": "half"})
    flushed = scan_file(str(plain), half)
    assert {f.code for f in flushed.findings if f.is_error} >= {"NH005"}  # cap: inf in FP16
    report = scan_file(str(kept), half)
    assert [f.code for f in report.findings] == []  # eps and cap stay FP32: nothing to find


def test_half_mode_restores_a_kept_module_bit_identical(tmp_path: Path) -> None:
    from nan_hunter.project.loader import load_target

    path = tmp_path / "kept.py"
    path.write_text(KEPT_MODEL.format(keep=KEEP), encoding="utf-8")
    target = load_target(str(path))
    before = _snapshot(target.model)
    scan(target.model, target.batch.raw, mode="half")
    assert {t.dtype for t in [*target.model.parameters(), *target.model.buffers()]} == {
        torch.float32
    }
    _assert_same(before, _snapshot(target.model))


# --- the search offers it, and the re-scan verifies it -----------------------------------------

FLUSHED_EPS = """\
import torch
from torch import nn


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("eps", torch.tensor(1e-9))

    def forward(self, x):
        h = self.fc(x) * 1e-4
        v = h.pow(2).mean(-1, keepdim=True)
        return h * torch.rsqrt(v + self.eps)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = Norm()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.norm(x))


def build_model():
    torch.manual_seed(0)
    return Net()


def sample_batch():
    torch.manual_seed(0)
    return torch.randn(4, 8) * 1e-3
"""


def test_a_buffer_flushed_by_half_gets_its_module_kept_in_fp32_verified(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(FLUSHED_EPS, encoding="utf-8")
    report = scan_file(str(path), load_settings(overrides={"mode": "half"}))
    errors = [f for f in report.findings if f.is_error]
    assert errors, [f.code for f in report.findings]
    fix = errors[0].fix
    assert fix is not None
    chosen = next((f for f in (fix, *fix.alternatives) if f.verified), None)
    assert chosen is not None, [(f.title, f.verification) for f in (fix, *fix.alternatives)]
    assert chosen.title.startswith("Keep Norm in FP32 under .half()"), chosen.title
    assert "+    def _apply(self, fn, *args, **kwargs):" in (chosen.diff or "")


def test_a_mask_buffer_beyond_fp16_gets_a_constant_fp16_holds_then_its_module_kept() -> None:
    """The buffer's literal written as -1e4 comes first (unsafe, measured: the FP32 loss does
    not move on this batch, so it is taken, moving nothing to FP32); the module kept in FP32
    follows it, not re-scanned since it cannot cost less."""
    from tests.conftest import FIXTURES

    report = scan_file(
        str(FIXTURES / "half_mask_buffer.py"), load_settings(overrides={"mode": "half"})
    )
    (finding,) = [f for f in report.findings if f.code == "NH005"]
    assert finding.fix is not None
    assert not finding.fix.edits  # the rule's own advice: finfo where the buffer is used
    constant, kept = finding.fix.alternatives
    assert constant.title == (
        "Use -1e4 instead of -1.00e+10: float16 holds it, and a mask value stays finite after "
        "the add or subtraction that follows (changes the numerics)"
    )
    assert constant.applicability is Applicability.UNSAFE
    assert constant.verified is True and constant.measured_harmless
    assert [e.replacement for e in constant.edits] == [
        '        self.register_buffer("neg", torch.tensor(-1e4))  # <- buffer\n'
    ]
    assert constant.cost is not None and constant.cost.added_matmul_share == 0.0
    assert kept.title.startswith("Keep CausalAttn (block) in FP32 under .half()")
    assert kept.verified is None


def test_a_large_positive_buffer_gets_no_constant_rewrite(tmp_path: Path) -> None:
    """A scale of 1e10 is the model's own number, not a mask value: only the kept module."""
    from tests.conftest import FIXTURES

    path = tmp_path / "scaled.py"
    path.write_text((FIXTURES / "half_mask_buffer.py").read_text().replace(
        'torch.tensor(-1e10)', 'torch.tensor(1e10)'))
    report = scan_file(str(path), load_settings(overrides={"mode": "half"}))
    nh005 = [f for f in report.findings if f.code == "NH005"]
    assert nh005 and nh005[0].fix is not None
    assert all("-1e4" not in f.title for f in nh005[0].fix.alternatives)


def test_a_modules_own_apply_that_raises_under_half_is_the_models_error(tmp_path: Path) -> None:
    from nan_hunter.errors import UserCodeError

    path = tmp_path / "model.py"
    keep = KEEP.replace("return t.to(cast.device)", "raise ValueError('no half')")
    path.write_text(KEPT_MODEL.format(keep=keep), encoding="utf-8")
    with pytest.raises(UserCodeError, match=r"during the cast to float16 \(model.half\(\)\)"):
        scan_file(str(path), load_settings(overrides={"mode": "half"}))


def test_a_modules_own_apply_that_raises_on_the_move_is_the_models_error(tmp_path: Path) -> None:
    from nan_hunter.errors import UserCodeError

    path = tmp_path / "model.py"
    keep = KEEP.replace("            cast = fn(t)\n", "            raise ValueError('no move')\n")
    path.write_text(KEPT_MODEL.format(keep=keep), encoding="utf-8")
    with pytest.raises(UserCodeError, match=r"during the move to cpu .*: no move"):
        scan_file(str(path))
