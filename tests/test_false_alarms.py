"""No false alarm on patterns real architectures use (issue 38).

- a module returning a view of its parameter (Perceiver's ``latents.expand``) is seen;
- a forward recomputed in the backward (Reformer's reversible layers) is a "not checked" note,
  not NH003;
- memory no op wrote (``torch.empty``'s result, written in part) is not data: no origin, no
  statistics, no propagation;
- ops the tracer did not see are a warning (NH003): a gap in what was checked, said, that does
  not fail the scan unless warnings do.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import nan_hunter
from nan_hunter.findings import Severity
from tests.conftest import FIXTURES, scanned


def test_a_view_of_a_parameter_returned_by_a_module_is_seen() -> None:
    report = scanned(FIXTURES / "fx_expanded_parameter.py")
    assert report.findings == ()
    assert report.target.unchecked == ()
    assert report.exit_code() == 0


def test_a_forward_recomputed_in_the_backward_is_a_note_not_a_finding() -> None:
    report = scanned(FIXTURES / "fx_reversible_layers.py")
    assert report.findings == ()
    assert report.target.unchecked == (
        "the forward of block.g.0 and 5 more modules recomputed in the backward (reversible "
        "layers, activation checkpointing): not traced op by op; the forward it repeats was",
    )
    assert report.exit_code() == 0


def test_unseen_ops_are_a_warning_that_fails_only_on_warning(tmp_path: Path) -> None:
    from tests.hostile.cases import HIDDEN_IN_A_SUBMODULE

    path = tmp_path / "model.py"
    path.write_text(HIDDEN_IN_A_SUBMODULE)
    report = scanned(path)
    (finding,) = report.findings
    assert (finding.code, finding.severity, finding.module) == ("NH003", Severity.WARNING, "gram")
    assert report.target.unchecked == ("ops the tracer did not see computed the output of gram",)
    assert (report.exit_code(), report.exit_code("warning")) == (0, 1)


# ---------------------------------------------------------------------------------------------
# memory no op wrote


def _fixture(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_false_alarm_{name}", FIXTURES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _garbage_allocations(monkeypatch: pytest.MonkeyPatch, path: Path, value: float) -> None:
    """``torch.empty``, ``torch.empty_like`` and ``Tensor.new_empty``, called from ``path``,
    return memory holding ``value`` (what a real allocation may hold: NaN, inf, subnormals),
    written out of the tracer's sight: a deterministic stand-in for reused memory."""
    for owner, name in ((torch, "empty"), (torch, "empty_like"), (torch.Tensor, "new_empty")):
        real = getattr(owner, name)

        def garbage(*args: Any, _real: Any = real, **kwargs: Any) -> torch.Tensor:
            t = _real(*args, **kwargs)
            if sys._getframe(1).f_code.co_filename == str(path) and t.is_floating_point():
                with torch._C.DisableTorchFunction():
                    t.fill_(value)
            return t

        garbage.__name__ = name  # a method replaced on Tensor reaches the tracer as itself
        monkeypatch.setattr(owner, name, garbage)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e-6, 6e4])
def test_an_allocation_holding_garbage_is_no_origin_and_no_data(
    monkeypatch: pytest.MonkeyPatch, value: float
) -> None:
    path = FIXTURES / "fx_uninitialised_buffer.py"
    module = _fixture(path.name)
    model, batch = module.build_model(), module.sample_batch()
    _garbage_allocations(monkeypatch, path, value)
    report = nan_hunter.scan(model, batch)
    assert report.findings == (), [(f.code, f.op, f.message[:80]) for f in report.findings]
    assert report.propagated == 0 and report.exit_code("warning") == 0
    scaling = report.target.loss_scaling
    assert scaling is not None and (scaling.used, scaling.skipped) == (2.0**16, 0)
    allocations = [
        op for op in report.range_map.top + report.range_map.bottom
        if op.op in ("torch.empty", "torch.empty_like", "Tensor.new_empty")
    ]
    assert allocations == []


class _CastInBackward(torch.autograd.Function):
    """A backward that casts its FP32 gradient to FP16 through an allocation and a copy."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        low = torch.empty_like(grad, dtype=torch.float16)  # an allocation, then the cast
        low.copy_(grad)
        return low.float()


def test_an_allocation_in_the_backward_is_no_gradient_cast() -> None:
    """The gradient log measures a gradient where an FP32 one is cast to FP16; ``empty_like(grad,
    dtype=float16)`` casts nothing (what it holds is no gradient): no boundary is logged for
    it, whatever the allocation holds."""
    from nan_hunter.precision.emulation import LowPrecisionEmulation
    from nan_hunter.precision.formats import FP16
    from nan_hunter.precision.gradients import GradientLog

    x = torch.linspace(1.0, 2.0, 8, requires_grad=True)
    log = GradientLog(FP16)
    loss = _CastInBackward.apply(x).sum()
    with LowPrecisionEmulation(torch.float16, log):
        (grad,) = torch.autograd.grad(loss, [x])
    assert log.boundaries == []
    assert grad.tolist() == [1.0] * 8


class _CopyIntoAllocation(torch.autograd.Function):
    """A backward that allocates and copies its FP16 gradient, as ``CopySlices``' does."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.new_empty_strided(grad.shape, (1,)).copy_(grad)


def test_an_allocation_in_the_backward_is_not_emulated_nor_logged() -> None:
    """Emulated, ``new_empty_strided`` of an FP16 gradient ran on an FP32 copy and its garbage,
    rounded, was logged as a gradient (a largest gradient of 1e19 on a clean model)."""
    from nan_hunter.precision.emulation import LowPrecisionEmulation
    from nan_hunter.precision.formats import FP16
    from nan_hunter.precision.gradients import GradientLog

    x = torch.full((64,), 3.0, dtype=torch.float16, requires_grad=True)
    log = GradientLog(FP16)
    with LowPrecisionEmulation(torch.float16, log) as mode:
        (grad,) = torch.autograd.grad(_CopyIntoAllocation.apply(x).sum(), [x])
    assert mode.emulated == 1  # the forward's sum; nothing in the backward
    assert log.max_abs == 0.0 and not log.overflowed
    assert grad.tolist() == [1.0] * 64


# ---------------------------------------------------------------------------------------------
# an inf the model absorbs


def test_an_inf_absorbed_by_a_softmax_is_a_warning_naming_it() -> None:
    report = scanned(FIXTURES / "fx_mask_absorbed.py")
    (finding,) = report.findings
    assert (finding.code, finding.severity, finding.op, finding.module) == (
        "NH104", Severity.WARNING, "Tensor.__mul__", "attn"
    )
    assert finding.notes[0] == (
        "absorbed by softmax at fx_mask_absorbed.py:35: the non-finite values reach no module "
        "output, and the loss and gradients stay finite (a warning; --fail-on warning fails "
        "on it)"
    )
    assert finding.fix is not None  # the constant is still beyond FP16's range: its fix stays
    assert report.loss is not None and report.loss.finite
    assert (report.errors, report.exit_code(), report.exit_code("warning")) == (0, 0, 1)


def test_an_inf_absorbed_in_the_forward_that_makes_a_nan_in_the_backward_is_an_error() -> None:
    report = scanned(FIXTURES / "fx_absorbed_nan_backward.py")
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    assert [(f.code, f.op, f.module) for f in errors] == [("NH104", "Tensor.__mul__", "")]
    assert not any(n.startswith("absorbed") for n in errors[0].notes)
    assert report.exit_code() == 1
