"""The re-run of a captured model call: its loss reproduces the real output gradients."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nan_hunter.training.rerun import ModelCall, OutputGradientLoss, StepPrecision


def test_output_gradient_loss_gives_back_the_real_gradient_divided_by_the_scale() -> None:
    out = torch.randn(3, 4, requires_grad=True)
    real = torch.randn(3, 4) * 1024
    loss = OutputGradientLoss({0: real}, scale=1024.0)(out, None)
    loss.backward()
    assert out.grad is not None
    torch.testing.assert_close(out.grad, real / 1024)


def test_non_finite_real_gradients_count_as_zero() -> None:
    out = torch.ones(2, requires_grad=True)
    OutputGradientLoss({0: torch.tensor([float("nan"), 2.0])}, scale=None)(out, None).backward()
    assert out.grad is not None and out.grad.tolist() == [0.0, 2.0]


def test_an_output_computed_from_another_output_is_left_out() -> None:
    """A model returning (loss, logits) with the loss made from the logits: the logits' real
    gradient already holds the loss's share, so only the loss term drives the backward."""
    weight = torch.randn(4, requires_grad=True)
    logits = weight * 2
    loss = logits.sum()
    surrogate = OutputGradientLoss({0: torch.tensor(1.0), 1: torch.ones(4)}, scale=None)
    surrogate({"loss": loss, "logits": logits}, None).backward()
    assert weight.grad is not None and weight.grad.tolist() == [2.0] * 4


def test_a_captured_call_keeps_the_gradient_that_reached_each_output() -> None:
    model = torch.nn.Linear(3, 2)
    x = torch.randn(5, 3)
    out = model(x)
    tripled = out * 3
    call = ModelCall(model, (x,), {}, StepPrecision.now(model, (x,)))
    call.watch_outputs((out, "not a tensor", {"again": tripled}))
    (out.sum() * 2 + tripled.sum()).backward()
    assert sorted(call.grads) == [0, 2] and call.outputs == 2
    torch.testing.assert_close(call.grads[0], torch.full((5, 2), 5.0))  # 2 + 3 via tripled
    torch.testing.assert_close(call.grads[2], torch.ones(5, 2))
    assert call.precision == StepPrecision("cpu", False, None, torch.float32)


def test_a_gradient_that_is_nan_everywhere_is_not_usable() -> None:
    assert not OutputGradientLoss({0: torch.full((3,), float("nan"))}, scale=2.0).usable
    assert OutputGradientLoss({0: torch.tensor([float("nan"), 1.0])}, scale=2.0).usable


@dataclass
class _Output:
    logits: torch.Tensor
    name: str = "out"


def test_a_model_call_returning_a_plain_dataclass_keeps_its_output_gradient() -> None:
    model = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    out = _Output(model(x))
    call = ModelCall(model, (x,), {}, StepPrecision.now(model, (x,)))
    call.watch_outputs(out)
    (out.logits.sum() * 2).backward()
    assert call.outputs == 1 and sorted(call.grads) == [0]
    torch.testing.assert_close(call.grads[0], torch.full((4, 2), 2.0))
