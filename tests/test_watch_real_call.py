"""``watch`` re-runs the step as the loop ran it: the model's real call, the real gradient at its
outputs, the weights before a skipped update; and it says so on the log."""

from __future__ import annotations

import copy
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_, clip_grad_value_  # bound before any watch starts

from nan_hunter import watch
from nan_hunter.training.rerun import OutputGradientLoss


class DictModel(nn.Module):
    """Takes the whole batch dict, as many HF-style models do: ``model(batch)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.fc(batch["x"])


class PairModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def loss_fn(output: torch.Tensor, batch: Any) -> torch.Tensor:
    y = batch["y"] if isinstance(batch, dict) else batch[1]
    return (output.squeeze(-1) - y).pow(2).mean()


def _batches(as_dict: bool) -> list[Any]:
    torch.manual_seed(0)
    batches = []
    for step in range(4):
        x, y = torch.randn(8, 4), torch.randn(8)
        if step == 2:
            x[3, 1] = 1e30  # finite in FP32; the squared error is not
        batches.append({"x": x, "y": y} if as_dict else (x, y))
    return batches


@pytest.mark.parametrize("as_dict", [True, False], ids=["model(batch) dict", "model(x) tuple"])
def test_the_rerun_calls_the_model_as_the_loop_did(as_dict: bool) -> None:
    """Before: ``w.step((x, y), loss)`` re-ran ``model(x, y)`` and a dict ``model(**batch)``,
    so the README's loop got ``event.report is None`` (an unexpected argument)."""
    torch.manual_seed(0)
    model = DictModel() if as_dict else PairModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, optimizer, loss_fn=loss_fn, on_problem="stop") as w:
        for batch in _batches(as_dict):
            inputs = batch if as_dict else batch[0]
            loss = loss_fn(model(inputs), batch)
            loss.backward()
            optimizer.step()
            w.step(batch, loss)
            optimizer.zero_grad()
            if w.stopped:
                break
    (event,) = w.reports
    assert event.step == 2
    assert event.report is not None, event.detail
    first = event.report.findings[0]
    assert (first.code, first.op, first.module) == ("NH101", "torch.nn.functional.linear", "fc")


def test_without_a_loss_fn_the_real_output_gradient_drives_the_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No ``loss_fn``: the re-run's backward is the real one (here the loss only looks at the
    first output column), not the sum of the output's means."""
    import nan_hunter.api

    real_scan = nan_hunter.api.scan
    seen: list[Any] = []

    def spy(model: nn.Module, batch: Any, loss_fn: Any = None, **kwargs: Any) -> Any:
        seen.append(loss_fn)
        return real_scan(model, batch, loss_fn, **kwargs)

    monkeypatch.setattr(nan_hunter.api, "scan", spy)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, optimizer) as w:
        x = torch.randn(8, 4)
        model(x)[:, 0].sum().backward()
        assert model.weight.grad is not None
        model.weight.grad[0, 0] = float("inf")  # a gradient problem; the loss is fine
        optimizer.step()
        event = w.step(x)
    assert event is not None and event.report is not None, event
    (loss_fn,) = seen
    assert isinstance(loss_fn, OutputGradientLoss)
    assert loss_fn.grads[0].tolist() == [[1.0, 0.0]] * 8


def test_a_failed_rerun_does_not_use_up_max_reports() -> None:
    class CopiesOnSecondTry(PairModel):
        tries = 0

        def __deepcopy__(self, memo: dict[int, Any]) -> nn.Module:
            CopiesOnSecondTry.tries += 1
            if CopiesOnSecondTry.tries == 1:
                raise TypeError("not now")
            fresh = PairModel()
            fresh.load_state_dict(copy.deepcopy(self.state_dict()))
            return fresh

    model, x = CopiesOnSecondTry(), torch.randn(2, 4)
    w = watch(model, max_reports=1)
    first = w.step(x, torch.tensor(float("nan")))
    second = w.step(x, torch.tensor(float("nan")))
    assert first is not None and first.report is None
    assert second is not None and second.report is not None, second.detail
    assert w.reports == [first, second]


def test_a_problem_is_logged_as_a_warning_in_a_single_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, x = PairModel(), torch.randn(2, 4)
    with caplog.at_level(logging.WARNING, logger="nan_hunter"):
        watch(model).step(x, torch.tensor(float("nan")))
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "nan-hunter: training step 0: non_finite_loss; the re-run of the step is clean "
        "(not reproducible)"
    )


def test_the_rerun_takes_the_autocast_dtype_the_step_ran_under() -> None:
    """A BF16 autocast loop was re-run as FP16 (the configured default)."""
    torch.manual_seed(0)
    model = PairModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, optimizer) as w:
        x = torch.randn(8, 4)
        x[0, 0] = float("nan")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().mean()
        loss.backward()
        optimizer.step()
        event = w.step(x, loss)
    assert event is not None and event.report is not None
    assert (event.report.target.mode, event.report.target.dtype) == ("autocast", "bfloat16")


@pytest.mark.parametrize("clip", [clip_grad_norm_, clip_grad_value_], ids=lambda f: f.__name__)
def test_clipping_before_unscale_is_caught_whatever_the_import_and_names_the_line(
    clip: Any,
) -> None:
    """Before, only ``torch.nn.utils.clip_grad_norm_`` looked up at call time was caught: a
    script that imported the function by name before the watch started was not."""
    torch.manual_seed(0)
    model = PairModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randn(8, 4)
    with watch(model, optimizer, scaler) as w:
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        clip(model.parameters(), 1.0)
        line = sys._getframe().f_lineno - 1
        scaler.step(optimizer)
        scaler.update()
        w.step(x, loss)
    (warning,) = w.warnings
    assert warning.where == f"{__file__}:{line}"
    assert f"{clip.__name__} was called at {__file__}:{line} on scaled gradients" in (
        warning.message
    )


def test_a_library_models_report_is_named_after_the_script(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Trainer's report header named ``modeling_bert.py`` (the model's class file in
    site-packages), not the user's script."""
    import nan_hunter

    library = tmp_path / "site-packages"
    library.mkdir()
    (library / "libmodel.py").write_text(
        "import torch\n\n\nclass LibModel(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 1)\n\n"
        "    def forward(self, x):\n        return self.fc(x)\n"
    )
    script = tmp_path / "train.py"
    script.write_text("# the user's training script\n")
    monkeypatch.syspath_prepend(str(library))
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(script), raising=False)
    from libmodel import LibModel  # type: ignore[import-not-found]

    x = torch.randn(2, 4)
    x[0, 0] = float("nan")
    report = nan_hunter.scan(LibModel(), x, device="cpu")
    assert report.target.file == str(script.resolve())
    assert report.target.notes[-1] == (
        f"the model's class LibModel is defined in {(library / 'libmodel.py').resolve()}"
    )


def test_watch_says_the_verdict_on_the_cause_as_run_does(tmp_path: Path) -> None:
    """An FP16 overflow in the Linear (inputs of 3000 times weights of ~0.75, summed over 32
    features: 7e4): the one re-run reproduces it, finite in FP32: a precision problem, in the
    event's report, its log line and the JSON ``watch`` writes; a NaN in the inputs is a real
    bug."""
    from tests.training_models import OVERFLOW, Tiny

    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    output = tmp_path / "nan.json"
    with watch(model, optimizer, output=output) as w:
        x = torch.full((2, 32), OVERFLOW)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x)["logits"].float().mean()
        loss.backward()
        optimizer.step()
        event = w.step(x, loss)
    assert event is not None and event.report is not None
    training = event.report.training
    assert training is not None and training.verdict is not None
    assert training.verdict.value == "precision_problem"
    assert training.evidence[0].startswith("the re-run in float16 reproduces it at NH10")
    assert (training.steps_checked, training.problem_step) == (0, 1)
    written = json.loads(output.read_text())["training"]
    assert written["verdict"] == "precision_problem"

    torch.manual_seed(0)
    model = Tiny()
    with watch(model) as w:
        x = torch.randn(2, 32)
        x[0, 0] = float("nan")
        loss = model(x)["logits"].mean()
        event = w.step(x, loss)
    assert event is not None and event.report is not None
    training = event.report.training
    assert training is not None and training.verdict is not None
    assert training.verdict.value == "real_bug"
