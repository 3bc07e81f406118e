"""Hard inputs: unusual outputs, batches, ops, wrappers, protected FP32 code, hooks and modes.

Each test checks real values (codes, ops, modules, lines, loss values, hook calls), not only
that the scan runs. Model files live in ``tests/hard_inputs/``; small models are defined inline.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections import UserDict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import nan_hunter
from nan_hunter.api import scan_file
from nan_hunter.errors import LoadError, UserCodeError
from nan_hunter.findings import Report
from nan_hunter.project.loader import load_target, unwrap_model
from nan_hunter.report import render
from tests.conftest import ROOT, marker_line
from tests.hard_inputs import hi_fp32_regions
from tests.test_model_state import _assert_same, _snapshot

HARD = ROOT / "tests" / "hard_inputs"
THIS_FILE = Path(__file__).resolve()


def _codes(report: Report) -> list[str]:
    return [f.code for f in report.findings]


def _stable(report: Report) -> Report:
    return dataclasses.replace(report, seconds=0.0)


def _stable_findings(report: Report) -> Report:
    """Everything but timing and the note on how the model was unwrapped."""
    return dataclasses.replace(
        report, seconds=0.0, target=dataclasses.replace(report.target, notes=())
    )


def _loss(report: Report) -> float:
    assert report.loss is not None and report.loss.max is not None
    assert report.loss.min == report.loss.max
    return report.loss.max


# -- model outputs of every structure, default loss ---------------------------------------------


@dataclasses.dataclass
class PlainOutput:
    logits: torch.Tensor
    hidden: torch.Tensor | None = None
    token_ids: torch.Tensor | None = None


class FakeModelOutput(collections.OrderedDict):
    """Like ``transformers.utils.ModelOutput``: an OrderedDict subclass and a dataclass whose
    ``None`` fields are not keys."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self.values())


@dataclasses.dataclass
class CausalOutput(FakeModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor | None, ...] | None = None


class Structured(nn.Module):
    """``a = 2x`` (via an identity Linear, so there is a backward) and ``b = x + 1``, returned in
    the structure ``kind`` names, with ``None`` and integer parts the default loss must skip."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(4, 4)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(4))
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> Any:
        a = self.fc(x) * 2.0
        b = x + 1.0
        ids = x.long()
        if self.kind == "tensor":
            return a
        if self.kind == "tuple":
            return (a, None, b, ids)
        if self.kind == "list":
            return [a, [b, None], ids]
        if self.kind == "dict":
            return {"a": a, "nested": {"b": b}, "none": None, "ids": ids}
        if self.kind == "dataclass":
            return PlainOutput(logits=a, hidden=b, token_ids=ids)
        if self.kind == "model_output":
            return CausalOutput(logits=a, hidden_states=(b, None))
        if self.kind == "none_parts":
            return (None, a, None)
        raise AssertionError(self.kind)


# FP16-exact inputs (multiples of 1/4), so the FP16 Linear changes nothing.
EXACT = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4
MEAN_A = float((EXACT * 2).mean())  # 2.75
MEAN_B = float((EXACT + 1).mean())  # 2.375


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("tensor", MEAN_A),
        ("tuple", MEAN_A + MEAN_B),
        ("list", MEAN_A + MEAN_B),
        ("dict", MEAN_A + MEAN_B),
        ("dataclass", MEAN_A + MEAN_B),
        ("model_output", MEAN_A + MEAN_B),
        ("none_parts", MEAN_A),
    ],
)
def test_default_loss_over_every_output_structure(kind: str, expected: float) -> None:
    report = nan_hunter.scan(Structured(kind), EXACT)
    assert report.status == "clean"
    assert _loss(report) == pytest.approx(expected, rel=1e-6)
    assert report.ops == 4  # linear, mul, add, long
    assert report.backward_nodes > 0  # the loss reached the Linear's parameters


def test_model_output_none_fields_are_not_keys() -> None:
    out = Structured("model_output")(EXACT)
    assert isinstance(out, dict) and dataclasses.is_dataclass(out)
    assert list(out.keys()) == ["logits", "hidden_states"]


def test_output_with_no_floating_tensor_asks_for_a_loss_fn() -> None:
    class Complex(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.fft.fft(x)

    with pytest.raises(UserCodeError, match=r"no floating-point tensor .* define loss_fn"):
        nan_hunter.scan(Complex(), torch.randn(2, 8))
    report = nan_hunter.scan(Complex(), torch.ones(2, 8), lambda out, batch: out.abs().sum())
    assert report.status == "clean"
    assert _loss(report) == pytest.approx(16.0)  # |fft(ones(8))| = [8, 0, ...], two rows


class ExpandTo(nn.Module):
    """``exp`` of ~12 is ~2.6e5 in FP32 (exp runs in FP32 under autocast), returned wrapped."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Any:
        e = torch.exp(x)  # <- escapes wrapped
        if self.kind == "tensor":
            return e
        if self.kind == "tuple":
            return (e,)
        if self.kind == "dict":
            return {"value": e}
        if self.kind == "dataclass":
            return PlainOutput(logits=e)
        return CausalOutput(logits=e)


class Unwrapper(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.expand = ExpandTo(kind)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.expand(x)
        if self.kind == "tensor":
            e = out
        elif self.kind == "tuple":
            e = out[0]
        elif self.kind == "dataclass":
            e = out.logits
        else:
            e = out["value" if self.kind == "dict" else "logits"]
        return self.fc(e.log())




@pytest.mark.parametrize(
    "kind",
    [
        "tensor",
        "tuple",
        "dict",
        "dataclass",
        "model_output",
    ],
)
def test_out_of_range_value_leaving_a_submodule_in_any_structure_is_a_warning(kind: str) -> None:
    torch.manual_seed(0)
    report = nan_hunter.scan(Unwrapper(kind), 11.5 + torch.rand(4, 8))
    assert _codes(report) == ["NH501"]
    (finding,) = report.findings
    assert (finding.op, finding.module) == ("torch.exp", "expand")
    assert finding.location is not None
    assert finding.location.line == marker_line(THIS_FILE, "# <- escapes wrapped")


# -- integer, bool, complex, empty and 0-d tensors ---------------------------------------------


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(4))
            self.fc.bias.zero_()

    def forward(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        mask: torch.Tensor,
        c: torch.Tensor,
        empty: torch.Tensor,
        scale: torch.Tensor,
    ) -> torch.Tensor:
        h = self.fc(x)
        h = h + ids.float().unsqueeze(-1) / 4  # int -> float
        h = h * mask.unsqueeze(-1)  # bool
        power = (c * c.conj()).real.sum()  # complex intermediate, real scalar out
        nothing = empty.sum() + (empty * 2).numel()  # empty tensor: sum 0
        both = (mask & (ids > 1)).sum()  # bool op, int result
        counted = ids.sum() + ids.max() * 2  # int reductions (0-d int tensors)
        return h * scale + power + nothing + both + counted.float() / 8


def _mixed_batch() -> dict[str, torch.Tensor]:
    return {
        "x": EXACT,
        "ids": torch.tensor([1, 2, 3]),
        "mask": torch.tensor([True, False, True]),
        "c": torch.tensor([1 + 1j, 2j, 0.5 + 0j], dtype=torch.complex64),
        "empty": torch.zeros(0),
        "scale": torch.tensor(0.5),  # 0-d
    }


def _mixed_reference(batch: dict[str, torch.Tensor]) -> float:
    x, ids, mask, c = batch["x"], batch["ids"], batch["mask"], batch["c"]
    h = (x + ids.float().unsqueeze(-1) / 4) * mask.unsqueeze(-1)
    power = float((c.abs() ** 2).sum())  # 2 + 4 + 0.25
    both = int((mask & (ids > 1)).sum())  # 1
    counted = int(ids.sum() + ids.max() * 2)  # 12
    return float((h * 0.5).mean()) + power + both + counted / 8


def test_int_bool_complex_empty_and_0d_tensors_in_batch_and_ops() -> None:
    batch = _mixed_batch()
    report = nan_hunter.scan(Mixed(), batch)
    assert report.status == "clean"
    assert _loss(report) == pytest.approx(_mixed_reference(batch), rel=1e-5)
    assert report.ops >= 15
    assert report.backward_nodes > 0


def test_0d_batch_and_0d_overflow() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.tensor(2.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.w  # <- 0-d product

    clean = nan_hunter.scan(Scale(), torch.tensor(3.0))
    assert clean.status == "clean"
    assert _loss(clean) == 6.0
    assert (clean.ops, clean.backward_nodes) == (1, 1)
    # 8e4 is beyond FP16's range but mul is not cast by autocast: an NH501 warning, not an error.
    warned = nan_hunter.scan(Scale(), torch.tensor(40000.0))
    assert _codes(warned) == ["NH501"]
    (finding,) = warned.findings
    assert finding.op == "Tensor.__mul__"
    assert finding.outputs[0].shape == ()
    assert finding.location is not None
    assert finding.location.line == marker_line(THIS_FILE, "# <- 0-d product")


def test_integer_only_batch_and_bool_batch() -> None:
    torch.manual_seed(0)
    embedding = nn.Embedding(10, 4)
    report = nan_hunter.scan(embedding, torch.tensor([[1, 2, 3]]))
    assert report.status == "clean"
    expected = float(embedding.weight.detach()[[1, 2, 3]].mean())
    assert _loss(report) == pytest.approx(expected, rel=1e-6)

    class Gate(nn.Module):
        def forward(self, keep: torch.Tensor) -> torch.Tensor:
            return keep.float() * 3.0

    assert _loss(nan_hunter.scan(Gate(), torch.tensor([True, False, True, True]))) == 2.25


def test_all_empty_batch_is_a_load_error() -> None:
    """Nothing to scan: a clean error naming the empty batch (not "define loss_fn"), no crash."""
    with pytest.raises(LoadError, match=r"returned only empty tensors \(shape \(0, 4\)\)"):
        nan_hunter.scan(nn.Linear(4, 4), torch.zeros(0, 4))


def test_mapping_batch_like_batch_encoding_becomes_kwargs() -> None:
    class BatchEncoding(UserDict):  # transformers' tokenizer output is a UserDict, not a dict
        pass

    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.emb(input_ids) * attention_mask.unsqueeze(-1)

    torch.manual_seed(0)
    model = Embed()
    batch = BatchEncoding(input_ids=torch.tensor([[1, 2]]), attention_mask=torch.tensor([[1, 0]]))
    report = nan_hunter.scan(model, batch)
    assert report.status == "clean"
    expected = float(model.emb.weight.detach()[1].sum() / 8)
    assert _loss(report) == pytest.approx(expected, rel=1e-6)




def test_nan_in_a_complex_batch_tensor_is_bad_input() -> None:
    batch = _mixed_batch()
    batch["c"] = torch.tensor([1 + 1j, complex(float("nan"), 0.0), 2j], dtype=torch.complex64)
    report = nan_hunter.scan(Mixed(), batch)
    assert _codes(report) == ["NH001"]
    assert "kwargs['c']" in report.findings[0].message


# -- in-place ops --------------------------------------------------------------------------------


class InPlace(nn.Module):
    def __init__(self, factor: float = 2.0, add: float = 1.0, fill: float = 0.0) -> None:
        super().__init__()
        self.factor, self.add, self.fill = factor, add, fill
        self.fc = nn.Linear(4, 4)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(4))
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h.add_(self.add)  # <- in-place add_
        h *= self.factor  # <- in-place imul
        h[h > 5.0] = self.fill  # <- in-place setitem
        return h


def test_in_place_ops_clean() -> None:
    report = nan_hunter.scan(InPlace(), EXACT)
    assert report.status == "clean"
    expected = (EXACT + 1.0) * 2.0
    expected[expected > 5.0] = 0.0
    assert _loss(report) == pytest.approx(float(expected.mean()), rel=1e-6)
    assert report.ops == 5  # linear, add_, __imul__, __gt__, __setitem__


@pytest.mark.parametrize(
    ("kwargs", "op", "marker"),
    [
        ({"add": 1e5}, "Tensor.add_", "# <- in-place add_"),
        ({"factor": 1e5}, "Tensor.__imul__", "# <- in-place imul"),
        ({"fill": 1e6}, "Tensor.__setitem__", "# <- in-place setitem"),
    ],
    ids=["add_", "imul", "setitem"],
)
def test_in_place_op_that_overflows_is_the_culprit(
    kwargs: dict[str, float], op: str, marker: str
) -> None:
    report = nan_hunter.scan(InPlace(**kwargs), EXACT)
    culprit = report.findings[0]
    if op == "Tensor.__setitem__":  # written last: the inf reaches the output
        assert report.errors == 1
    else:  # `h[h > 5.0] = fill` overwrites every inf: absorbed, a warning naming what did it
        assert (report.errors, culprit.severity.value) == (0, "warning")
        assert culprit.notes[0].startswith("absorbed by __setitem__ at test_hard_inputs.py:")
    assert culprit.op == op
    assert culprit.code.startswith("NH1")
    assert culprit.location is not None
    assert culprit.location.line == marker_line(THIS_FILE, marker)
    assert culprit.fp32_rerun is not None and culprit.fp32_rerun.finite
    assert culprit.outputs[0].dtype == "float16"
    assert culprit.outputs[0].posinf > 0


class MutatesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(1000.0)  # the batch itself, in place
        return self.fc(x)


def test_model_that_mutates_its_batch_in_place() -> None:
    batch = torch.full((2, 4), 100.0)
    report = nan_hunter.scan(MutatesItsInput(), batch)
    assert _codes(report) == ["NH101"]
    rerun = report.findings[0].fp32_rerun
    assert rerun is not None and rerun.abs_max is not None
    assert rerun.abs_max < 1e6  # the FP32 run saw the same 1e5 inputs as the FP16 run
    assert torch.equal(batch, torch.full((2, 4), 100.0))


# -- a model that returns its own loss -----------------------------------------------------------


class OwnLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)
        with torch.no_grad():
            self.fc.weight.fill_(0.25)
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pred = self.fc(x).squeeze(-1)
        return ((pred - y) ** 2).mean()


def test_model_returning_its_own_scalar_loss_needs_no_loss_fn() -> None:
    x, y = EXACT, torch.tensor([1.0, 2.0, 3.0])
    report = nan_hunter.scan(OwnLoss(), (x, y))
    assert report.status == "clean"
    pred = x.sum(-1) / 4  # [0.375, 1.375, 2.375]
    assert _loss(report) == pytest.approx(float(((pred - y) ** 2).mean()), rel=1e-6)
    assert report.loss is not None and report.loss.shape == ()
    assert report.backward_nodes > 0


# -- torch.compile, DataParallel, DistributedDataParallel ---------------------------------------


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _fake_ddp(module: nn.Module) -> DistributedDataParallel:
    """A DistributedDataParallel holding ``module``, without a process group (not initialised)."""
    ddp = DistributedDataParallel.__new__(DistributedDataParallel)
    nn.Module.__init__(ddp)
    ddp.module = module
    return ddp


def test_unwrap_model_rules() -> None:
    inner = Small()
    assert unwrap_model(inner) == (inner, ())
    compiled = torch.compile(inner, backend="eager")
    assert unwrap_model(compiled) == (
        inner,
        ("torch.compile: scanned the original module Small (OptimizedModule._orig_mod)",),
    )
    model, notes = unwrap_model(torch.compile(nn.DataParallel(inner), backend="eager"))
    assert model is inner
    assert notes == (
        "torch.compile: scanned the original module DataParallel (OptimizedModule._orig_mod)",
        "DataParallel: scanned the original module Small (DataParallel.module)",
    )
    ddp = _fake_ddp(inner)
    assert isinstance(ddp, DistributedDataParallel)
    model, notes = unwrap_model(ddp)
    assert model is inner
    assert notes == (
        "DistributedDataParallel: scanned the original module Small "
        "(DistributedDataParallel.module)",
    )
    empty = DistributedDataParallel.__new__(DistributedDataParallel)
    nn.Module.__init__(empty)
    assert unwrap_model(empty) == (empty, ())


def test_compiled_model_file_scans_the_original_module() -> None:
    path = HARD / "hi_compiled.py"
    target = load_target(str(path))
    assert type(target.model).__name__ == "Model"
    assert not hasattr(target.model, "_orig_mod")
    assert target.unwrapped == (
        "torch.compile: scanned the original module Model (OptimizedModule._orig_mod)",
    )
    report = scan_file(str(path))
    assert _codes(report) == ["NH102"]
    assert report.target.notes == target.unwrapped  # the report says so
    assert "note  torch.compile: scanned the original module" in render(report)
    (finding,) = report.findings
    assert (finding.op, finding.module) == ("torch.nn.functional.linear", "fc")
    assert finding.location is not None
    assert finding.location.line == marker_line(path, "# <- compiled culprit")
    assert Path(report.target.file) == path
    module = sys.modules[target.module_name]
    assert module.COMPILATIONS == []  # the compiled wrapper never ran


def test_scan_of_a_compiled_module_in_memory() -> None:
    compilations: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        compilations.append(1)
        return gm.forward

    torch.manual_seed(0)
    inner = Small()
    compiled = torch.compile(inner, backend=backend)
    before = _snapshot(compiled)
    report = nan_hunter.scan(compiled, torch.randn(2, 4))
    assert report.status == "clean"
    assert (report.ops, report.backward_nodes) == (1, 1)
    assert Path(report.target.file) == THIS_FILE  # the original class's file, not torch's
    assert compilations == []
    _assert_same(before, _snapshot(compiled))


def test_data_parallel_model_file_scans_the_wrapped_module() -> None:
    path = HARD / "hi_data_parallel.py"
    target = load_target(str(path))
    assert type(target.model).__name__ == "Model"
    assert target.unwrapped == (
        "DataParallel: scanned the original module Model (DataParallel.module)",
    )
    report = scan_file(str(path))
    assert _codes(report) == ["NH102"]
    (finding,) = report.findings
    assert (finding.op, finding.module) == ("torch.nn.functional.linear", "encoder.1")
    assert finding.location is not None
    assert finding.location.line == marker_line(path, "# <- data parallel culprit")


def test_data_parallel_and_ddp_in_memory_scan_the_same_as_the_module() -> None:
    torch.manual_seed(0)
    inner = Small()
    batch = torch.randn(2, 4)
    plain = _stable(nan_hunter.scan(inner, batch))
    dp = nn.DataParallel(inner)
    before = _snapshot(dp)
    wrapped = nan_hunter.scan(dp, batch)
    assert wrapped.target.notes == (
        "DataParallel: scanned the original module Small (DataParallel.module)",
    )
    assert _stable_findings(wrapped) == _stable_findings(plain)
    _assert_same(before, _snapshot(dp))
    assert _stable_findings(nan_hunter.scan(_fake_ddp(inner), batch)) == _stable_findings(plain)


@pytest.mark.parametrize("prefixed", [True, False], ids=["wrapper-keys", "module-keys"])
@pytest.mark.parametrize("file", ["hi_compiled.py", "hi_data_parallel.py"])
def test_weights_load_into_a_wrapped_model_with_or_without_prefix(
    tmp_path: Path, file: str, prefixed: bool
) -> None:
    built = load_target(str(HARD / file))
    inner = built.model
    state = {k: torch.full_like(v, 0.125) for k, v in inner.state_dict().items()}
    if prefixed:
        prefix = "_orig_mod." if file == "hi_compiled.py" else "module."
        state = {prefix + k: v for k, v in state.items()}
    weights = tmp_path / "weights.pt"
    torch.save(state, weights)
    target = load_target(str(HARD / file), weights=weights)
    assert all(bool((v == 0.125).all()) for v in target.model.state_dict().values())


# -- FP32 regions the user already protected ----------------------------------------------------


def test_autocast_disabled_region_and_custom_fwd_are_not_flagged() -> None:
    report = scan_file(str(HARD / "hi_fp32_regions.py"))
    assert report.status == "clean"
    assert report.findings == ()
    assert report.warnings == 0
    assert report.backward_nodes > 0
    # ~log1p(8 * 100 * 150.5) per value: the FP32 values really did exceed 65504 on the way.
    assert _loss(report) < 20.0


def test_the_same_computation_unprotected_is_flagged() -> None:
    report = nan_hunter.scan(hi_fp32_regions.Unprotected(), hi_fp32_regions.sample_batch())
    assert _codes(report) == ["NH102"]
    (finding,) = report.findings
    assert finding.op == "Tensor.__matmul__"
    assert finding.location is not None
    path = HARD / "hi_fp32_regions.py"
    assert Path(finding.location.file).resolve() == path
    assert finding.location.line == marker_line(path, "# <- unprotected culprit")
    assert finding.fp32_rerun is not None and finding.fp32_rerun.abs_max is not None
    assert finding.fp32_rerun.abs_max == pytest.approx(8 * 100 * 150.5, rel=0.01)


# -- hooks, modes, size, determinism, state ------------------------------------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _hooked() -> tuple[Net, list[str]]:
    model = Net()
    calls: list[str] = []
    model.fc1.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    model.fc1.register_forward_hook(lambda m, args, out: calls.append("forward"))
    model.fc2.register_full_backward_hook(lambda m, gin, gout: calls.append("backward"))
    model.fc2.register_full_backward_pre_hook(lambda m, gout: calls.append("backward_pre"))
    return model, calls


def test_user_hooks_are_kept_called_and_untouched() -> None:
    from torch.nn.modules import module as module_mod

    model, calls = _hooked()
    before = _snapshot(model)
    global_hooks = (
        dict(module_mod._global_forward_hooks),
        dict(module_mod._global_forward_pre_hooks),
        dict(module_mod._global_backward_hooks),
    )
    report = nan_hunter.scan(model, torch.randn(3, 4))
    assert report.status == "clean"
    # One forward and one backward (a clean model has no FP32 rerun).
    assert calls == ["pre", "forward", "backward_pre", "backward"]
    _assert_same(before, _snapshot(model))
    assert (
        dict(module_mod._global_forward_hooks),
        dict(module_mod._global_forward_pre_hooks),
        dict(module_mod._global_backward_hooks),
    ) == global_hooks
    # The hooks still work after the scan, and only once each.
    calls.clear()
    model(torch.randn(3, 4)).sum().backward()
    assert calls == ["pre", "forward", "backward_pre", "backward"]


def test_hooks_without_backward_and_with_fp32_rerun() -> None:
    model, calls = _hooked()
    nan_hunter.scan(model, torch.randn(3, 4), backward=False)
    assert calls == ["pre", "forward"]
    calls.clear()
    # fc1's FP16 output (~1.2e5) overflows: the FP32 reference pass runs the model again.
    with torch.no_grad():
        model.fc1.weight.fill_(300.0)
    # (verify_fixes=False: verifying the fix would run the hooks again, on a patched copy)
    report = nan_hunter.scan(model, torch.full((3, 4), 100.0), verify_fixes=False)
    assert _codes(report)[0] == "NH102"
    assert report.findings[0].module == "fc1"
    assert calls == ["pre", "forward", "backward_pre", "backward", "pre", "forward"]


def test_forward_hook_that_replaces_the_output_is_traced() -> None:
    model = Net()
    model.fc2.register_forward_hook(lambda m, args, out: out * 1e6)  # <- hook scales
    report = nan_hunter.scan(model, torch.randn(3, 4))
    assert report.errors == 1
    culprit = report.findings[0]
    assert culprit.op == "Tensor.__mul__"
    assert culprit.location is not None
    assert culprit.location.line == marker_line(THIS_FILE, "# <- hook scales")


def test_op_in_a_forward_hook_is_attributed_to_the_hooked_module() -> None:
    model = Net()
    model.fc2.register_forward_hook(lambda m, args, out: out * 1e6)
    report = nan_hunter.scan(model, torch.randn(3, 4))
    assert report.findings[0].module == "fc2"


class Normed(nn.Module):
    """Eval-mode BatchNorm divides by sqrt(running_var + eps) ~ 3.2e-3: ~300 becomes ~9e4."""

    def __init__(self, dropout: bool) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5) if dropout else nn.Identity()
        self.fc = nn.Linear(4, 2)
        with torch.no_grad():
            self.bn.running_var.fill_(1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(self.bn(x)))  # <- eval culprit


def _normed_batch() -> torch.Tensor:
    torch.manual_seed(0)
    return 300.0 + torch.randn(8, 4)


def test_eval_mode_uses_running_stats_and_stays_eval() -> None:
    torch.manual_seed(0)
    model = Normed(dropout=False)
    assert nan_hunter.scan(model, _normed_batch()).status == "clean"  # train: batch stats
    model.eval()
    before = _snapshot(model)
    report = nan_hunter.scan(model, _normed_batch())
    assert _codes(report) == ["NH101"]
    (finding,) = report.findings
    assert (finding.op, finding.module) == ("torch.nn.functional.linear", "fc")
    assert finding.location is not None
    assert finding.location.line == marker_line(THIS_FILE, "# <- eval culprit")
    assert finding.inputs[0].abs_max is not None and 8e4 < finding.inputs[0].abs_max < 1e5
    assert not any(m.training for m in model.modules())
    _assert_same(before, _snapshot(model))


def test_eval_mode_dropout_between_does_not_add_a_warning() -> None:
    torch.manual_seed(0)
    model = Normed(dropout=True).eval()
    assert _codes(nan_hunter.scan(model, _normed_batch())) == ["NH101"]


def test_large_activation_scan_completes() -> None:
    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc = nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x)).sum(-1)

    torch.manual_seed(0)
    x = torch.randn(16384, 256)  # 4.2M elements per activation
    report = nan_hunter.scan(Wide(), x)
    assert report.errors == 0
    assert report.ops == 3
    assert report.backward_nodes == 3


@pytest.mark.parametrize(
    "make",
    [
        lambda: (InPlace(factor=1e5), EXACT),
        lambda: (Normed(dropout=True).eval(), _normed_batch()),
        lambda: (Mixed(), _mixed_batch()),
    ],
    ids=["in-place-overflow", "eval-batchnorm", "mixed-dtypes"],
)
def test_same_scan_twice_gives_the_same_report(make: Any) -> None:
    torch.manual_seed(0)
    model, batch = make()
    first, second = nan_hunter.scan(model, batch), nan_hunter.scan(model, batch)
    assert first.findings == second.findings
    assert (first.ops, first.backward_nodes, first.propagated) == (
        second.ops,
        second.backward_nodes,
        second.propagated,
    )
    assert _stable(first) == _stable(second)
    assert render(first).replace(f"{first.seconds:.2f}s", "") == render(second).replace(
        f"{second.seconds:.2f}s", ""
    )


def test_same_model_file_scanned_twice_gives_the_same_report() -> None:
    path = ROOT / "tests" / "fixtures" / "fx_eps_underflow.py"
    assert _stable(scan_file(str(path))) == _stable(scan_file(str(path)))


@pytest.mark.parametrize(
    "make",
    [
        lambda: (InPlace(factor=1e5), EXACT),
        lambda: (Normed(dropout=False).eval(), _normed_batch()),
        lambda: (Normed(dropout=False), _normed_batch()),  # train: BatchNorm running stats
        lambda: (Mixed(), _mixed_batch()),
        lambda: (hi_fp32_regions.Model(), hi_fp32_regions.sample_batch()),
        lambda: (nn.DataParallel(Net()), torch.randn(3, 4)),
        lambda: (torch.compile(Net(), backend="eager"), torch.randn(3, 4)),
        lambda: (OwnLoss(), (EXACT, torch.ones(3))),
    ],
    ids=[
        "in-place",
        "eval",
        "train-batchnorm",
        "mixed",
        "fp32-regions",
        "data-parallel",
        "compiled",
        "own-loss",
    ],
)
def test_model_is_bit_identical_after_scan(make: Any) -> None:
    torch.manual_seed(0)
    model, batch = make()
    params = list(model.parameters())
    params[0].grad = torch.full_like(params[0], 0.5)
    before = _snapshot(model)
    report = nan_hunter.scan(model, batch)
    assert report.ops > 0
    _assert_same(before, _snapshot(model))
