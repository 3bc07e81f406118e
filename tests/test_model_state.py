"""A scan leaves the model bit-identical: parameters, buffers, .grad, modes, hooks, flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nan_hunter.engine.scan import scan_target
from nan_hunter.project.config import load_settings
from nan_hunter.project.loader import load_target
from tests.conftest import EXAMPLES, FIXTURES


def _snapshot(model: torch.nn.Module) -> dict[str, object]:
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
        "grads": {
            n: None if p.grad is None else p.grad.detach().clone()
            for n, p in model.named_parameters()
        },
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": {n: m.training for n, m in model.named_modules()},
        "hooks": {
            n: (dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks))
            for n, m in model.named_modules()
        },
    }


def _assert_same(before: dict[str, object], after: dict[str, object]) -> None:
    for kind in ("params", "buffers", "grads"):
        a, b = before[kind], after[kind]
        assert isinstance(a, dict) and isinstance(b, dict)
        assert a.keys() == b.keys()
        for name in a:
            if a[name] is None:
                assert b[name] is None, f"{kind} {name} was set by the scan"
                continue
            assert a[name].dtype == b[name].dtype, f"{kind} {name} changed dtype"
            assert torch.equal(a[name], b[name]), f"{kind} {name} changed"
    for kind in ("requires_grad", "training", "hooks"):
        assert before[kind] == after[kind], f"{kind} changed"


@pytest.mark.parametrize(
    "path",
    [FIXTURES / "fx_clean.py", FIXTURES / "fx_eps_underflow.py", EXAMPLES / "matrix_inverse.py"],
    ids=lambda p: p.stem,
)
def test_scan_leaves_model_bit_identical(path: Path) -> None:
    target = load_target(str(path))
    model = target.model
    params = list(model.parameters())
    params[0].grad = torch.full_like(params[0], 0.5)  # a user's existing gradient
    params[-1].requires_grad_(False)
    calls: list[str] = []
    model.register_forward_hook(lambda m, i, o: calls.append("hook"))
    before = _snapshot(model)

    report = scan_target(target, load_settings())

    assert report.ops > 0
    assert calls, "the user's own hook must still run during the scan"
    _assert_same(before, _snapshot(model))


def test_batchnorm_running_stats_are_restored() -> None:
    target = load_target(str(FIXTURES / "fx_clean.py"))
    bn = next(m for m in target.model.modules() if isinstance(m, torch.nn.BatchNorm1d))
    assert bn.training
    mean, var = bn.running_mean.clone(), bn.running_var.clone()
    tracked = int(bn.num_batches_tracked)
    scan_target(target, load_settings())
    assert torch.equal(bn.running_mean, mean)
    assert torch.equal(bn.running_var, var)
    assert int(bn.num_batches_tracked) == tracked


def test_eval_mode_is_kept_and_global_hooks_removed() -> None:
    from torch.nn.modules import module as module_mod

    target = load_target(str(FIXTURES / "fx_clean.py"))
    target.model.eval()
    global_before = (
        dict(module_mod._global_forward_hooks),
        dict(module_mod._global_forward_pre_hooks),
    )
    scan_target(target, load_settings())
    assert not any(m.training for m in target.model.modules())
    assert (
        dict(module_mod._global_forward_hooks),
        dict(module_mod._global_forward_pre_hooks),
    ) == global_before
    assert torch._C._len_torch_function_stack() == 0


def test_weights_written_in_forward_are_restored_without_a_full_copy() -> None:
    """Parameters are copied only when an op is about to write them (here via .data and an
    in-place op under no_grad, as weight-clipping code does)."""
    import nan_hunter

    class Clipping(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.other = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                self.fc.weight.data.clamp_(-0.1, 0.1)
                self.fc.bias.mul_(3.0)
            return self.other(self.fc(x))

    torch.manual_seed(0)
    model = Clipping()
    before = _snapshot(model)
    report = nan_hunter.scan(model, torch.randn(2, 4))
    assert report.ops > 0
    _assert_same(before, _snapshot(model))


def test_modes_are_restored_without_calling_train_where_nothing_changed() -> None:
    """A forward that switches a submodule's mode gets every flag back (a parent's ``train``
    sets its children, so parents go first); a module whose mode did not change is not asked
    to ``train`` again (an override may do more than set the flag)."""
    from nan_hunter.engine.model_state import ModelState

    calls: list[str] = []

    class Counted(torch.nn.Linear):
        def train(self, mode: bool = True) -> Counted:
            calls.append(f"{mode}")
            return super().train(mode)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kept = Counted(4, 4)
            self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout())
            self.block[1].eval()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.block.eval()  # the user's code switches a mode mid-forward
            return self.block(self.kept(x))

    net = Net()
    before = {n: m.training for n, m in net.named_modules()}
    state = ModelState(net)
    net(torch.randn(2, 4))
    calls.clear()
    state.restore()
    assert {n: m.training for n, m in net.named_modules()} == before
    assert calls == []
