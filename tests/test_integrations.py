"""Framework callbacks on a CPU with a tiny model: the Hugging Face Trainer, PyTorch Lightning,
and accelerate's wrapped objects given to ``watch``. Each test skips when its framework is not
installed (CI installs them: the ``frameworks`` extra)."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from nan_hunter import TrainingProblem, watch
from nan_hunter.training import Reason
from tests.conftest import marker_line
from tests.training_models import OVERFLOW, Tiny, dataset

MODEL_FILE = Path(__file__).resolve().parent / "training_models.py"
LINE = marker_line(MODEL_FILE, "# <- overflow")
BAD_STEP = 3


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)


# --------------------------------------------------------------------- Hugging Face Trainer

needs_trainer = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("accelerate") is None,
    reason="transformers and accelerate are not installed (pip install '.[frameworks]')",
)


def _trainer(
    tmp_path: Path, callback: Any, data: Any, steps: int = 8, accumulate: int = 1
) -> Any:
    tf = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    torch.manual_seed(0)
    args = tf.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=1, max_steps=steps,
        learning_rate=1e-3, report_to=[], logging_strategy="no", save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, gradient_accumulation_steps=accumulate,
    )
    return tf.Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[callback])


@needs_trainer
def test_trainer_callback_reports_the_step_module_and_line_and_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from nan_hunter.integrations.transformers import NanHunterCallback

    callback = NanHunterCallback()  # on_problem="stop"
    trainer = _trainer(tmp_path, callback, dataset(bad_step=BAD_STEP))
    with caplog.at_level(logging.WARNING, logger="nan_hunter"):
        trainer.train()
    # not silent (before: one INFO line, so the run just ended), counted as the Trainer logs
    report = tmp_path / f"nan_hunter_step{BAD_STEP + 1}.txt"
    assert [r.getMessage() for r in caplog.records if r.name == "nan_hunter"] == [
        f"nan-hunter: training step {BAD_STEP + 1}: non_finite_loss; NH101 "
        f"torch.nn.functional.linear in fc1 at {MODEL_FILE}:{LINE} (precision problem); "
        f"report {report}",
        f"nan-hunter: {BAD_STEP + 1} optimizer steps checked, 1 problem step (the first at "
        f"step {BAD_STEP + 1})",
    ]
    assert trainer.state.global_step == BAD_STEP + 1  # stopped after the bad step, of 8
    (event,) = callback.events
    assert (event.step, event.reason) == (BAD_STEP, Reason.LOSS)
    assert event.report is not None
    first = event.report.findings[0]
    assert (first.code, first.module) == ("NH101", "fc1")
    assert first.location is not None and first.location.line == LINE
    assert Path(first.location.file) == MODEL_FILE
    # the accelerate-wrapped optimizer was unwrapped for the step pre-hook
    assert type(trainer.optimizer).__name__ == "AcceleratedOptimizer"
    assert callback.watcher is not None and type(callback.watcher.optimizer).__name__ == "AdamW"
    # reports (text + JSON) in args.output_dir: the pre-flight (clean) and the bad step
    names = sorted(p.name for p in callback.report_files)
    assert names == [
        "nan_hunter_preflight.json", "nan_hunter_preflight.txt",
        f"nan_hunter_step{BAD_STEP + 1}.json", f"nan_hunter_step{BAD_STEP + 1}.txt",
    ]
    assert all(p.parent == tmp_path and p.exists() for p in callback.report_files)
    data = json.loads((tmp_path / f"nan_hunter_step{BAD_STEP + 1}.json").read_text())
    assert data["findings"][0]["module"] == "fc1"
    assert "error[NH101]" in (tmp_path / f"nan_hunter_step{BAD_STEP + 1}.txt").read_text()
    assert callback.preflight is not None and callback.preflight.status == "clean"


@needs_trainer
def test_trainer_callback_report_only_lets_the_run_finish(tmp_path: Path) -> None:
    from nan_hunter.integrations.transformers import NanHunterCallback

    callback = NanHunterCallback(on_problem="report", preflight=False)
    trainer = _trainer(tmp_path, callback, dataset(bad_step=BAD_STEP))
    trainer.train()
    assert trainer.state.global_step == 8
    # the bad step's update is skipped (before, it wrote NaN into the weights and every later
    # step was a problem too): one event, and the trained weights are finite
    assert [e.step for e in callback.events] == [BAD_STEP]
    assert callback.events[0].report is not None
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert callback.preflight is None


@needs_trainer
def test_trainer_callback_rescans_the_micro_batch_that_broke(tmp_path: Path) -> None:
    """Gradient accumulation over 2 micro-batches: the bad row is the first micro-batch of
    optimizer step 2; the re-run uses it, not the (clean) last micro-batch of the step."""
    from nan_hunter.integrations.transformers import NanHunterCallback

    callback = NanHunterCallback(preflight=False)
    trainer = _trainer(tmp_path, callback, dataset(n=12, bad_step=4), steps=6, accumulate=2)
    trainer.train()
    assert trainer.state.global_step == 3
    (event,) = callback.events
    assert (event.step, event.reason) == (2, Reason.LOSS)
    assert event.report is not None
    assert [(f.code, f.module) for f in event.report.findings[:1]] == [("NH101", "fc1")]


@needs_trainer
def test_trainer_preflight_catches_fp16_overflow_before_step_0(tmp_path: Path) -> None:
    """The first batch is fine in FP32 (the CPU run would train) but overflows FP16 under
    CUDA autocast: the pre-flight scan raises before the Trainer runs a step."""
    from nan_hunter.integrations.transformers import NanHunterCallback

    callback = NanHunterCallback(on_problem="raise")
    trainer = _trainer(tmp_path, callback, dataset(bad_step=0, value=OVERFLOW))
    with pytest.raises(TrainingProblem) as raised:
        trainer.train()
    assert trainer.state.global_step == 0
    event = raised.value.event
    assert (event.step, event.reason) == (-1, Reason.PREFLIGHT)
    assert event.report is not None
    first = event.report.findings[0]
    assert (first.code, first.module) == ("NH102", "fc1")
    assert first.location is not None and first.location.line == LINE
    assert (event.report.target.policy, event.report.target.dtype) == ("cuda", "float16")
    assert (tmp_path / "nan_hunter_preflight.json").exists()
    assert (tmp_path / "nan_hunter_preflight.txt").exists()


# --------------------------------------------------------------------- accelerate


def test_watch_takes_accelerates_wrapped_model_optimizer_and_scaler() -> None:
    accelerate = pytest.importorskip("accelerate")
    from accelerate.optimizer import AcceleratedOptimizer

    from nan_hunter.training.model_copy import replay_copy, unwrap_training_objects

    accelerator = accelerate.Accelerator(cpu=True)
    torch.manual_seed(0)
    model = accelerator.prepare(Tiny())
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=1e-3))
    assert isinstance(optimizer, AcceleratedOptimizer)
    rows = list(dataset(bad_step=BAD_STEP))
    steps = 0
    with watch(model, optimizer, on_problem="stop") as w:
        for row in rows:
            steps += 1
            x, labels = row["x"][None], row["labels"][None]
            loss = model(x, labels=labels)["loss"]
            accelerator.backward(loss)
            optimizer.step()
            w.step({"x": x, "labels": labels}, loss)
            optimizer.zero_grad()
            if w.stopped:
                break
    assert steps == BAD_STEP + 1
    (event,) = w.reports
    assert event.report is not None
    first = event.report.findings[0]
    assert (first.code, first.module, first.location and first.location.line) == (
        "NH101", "fc1", LINE
    )
    # an AcceleratedOptimizer built with a GradScaler: watch takes the scaler from it
    scaler = torch.amp.GradScaler("cpu")
    wrapped = AcceleratedOptimizer(torch.optim.SGD(Tiny().parameters(), lr=0.1), scaler=scaler)
    _, inner, found = unwrap_training_objects(Tiny(), wrapped, None)
    assert isinstance(inner, torch.optim.SGD) and found is scaler
    # a forward accelerate wrapped for mixed precision (``_original_forward`` kept beside it) is
    # put back to the module's own in the copy that is scanned
    plain = Tiny()
    plain._original_forward = plain.forward
    plain.forward = lambda *a, **k: {"logits": torch.zeros(1)}  # the wrapper, in effect
    replay = replay_copy(plain)
    assert "forward" not in replay.__dict__ and "_original_forward" not in replay.__dict__
    assert "forward" in plain.__dict__  # the user's model is untouched


# --------------------------------------------------------------------- PyTorch Lightning


def _fit(tmp_path: Path, callback: Any, data: Any, steps: int = 8) -> Any:
    pl = pytest.importorskip("pytorch_lightning")
    from tests.lightning_models import LitTiny

    torch.manual_seed(0)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, max_epochs=1, callbacks=[callback],
        default_root_dir=str(tmp_path), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    return trainer, LitTiny(), loader


def test_lightning_callback_reports_the_step_module_and_line_and_stops(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    from nan_hunter.integrations.lightning import NanHunterCallback

    callback = NanHunterCallback()
    trainer, module, loader = _fit(tmp_path, callback, dataset(bad_step=BAD_STEP))
    trainer.fit(module, loader)
    assert trainer.global_step == BAD_STEP + 1  # stopped after the bad step, of 8
    (event,) = callback.events
    assert (event.step, event.reason) == (BAD_STEP, Reason.LOSS)
    assert event.report is not None
    first = event.report.findings[0]
    assert (first.code, first.module) == ("NH101", "fc1")  # the module's own paths
    assert first.location is not None and first.location.line == LINE
    names = sorted(p.name for p in callback.report_files)
    assert names == [
        "nan_hunter_preflight.json", "nan_hunter_preflight.txt",
        f"nan_hunter_step{BAD_STEP + 1}.json", f"nan_hunter_step{BAD_STEP + 1}.txt",
    ]
    assert all(p.parent == tmp_path and p.exists() for p in callback.report_files)
    assert callback.preflight is not None and callback.preflight.status == "clean"
    assert callback.watcher is not None and callback.watcher.optimizer is trainer.optimizers[0]


def test_lightning_preflight_catches_fp16_overflow_before_step_0(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    from nan_hunter.integrations.lightning import NanHunterCallback

    callback = NanHunterCallback(on_problem="raise")
    trainer, module, loader = _fit(tmp_path, callback, dataset(bad_step=0, value=OVERFLOW))
    with pytest.raises(TrainingProblem) as raised:
        trainer.fit(module, loader)
    assert trainer.global_step == 0
    event = raised.value.event
    assert (event.step, event.reason) == (-1, Reason.PREFLIGHT)
    assert event.report is not None
    first = event.report.findings[0]
    assert (first.code, first.module) == ("NH102", "fc1")
    assert first.location is not None and first.location.line == LINE
    # verified against the patched class: before, the re-run's forward was a closure over the
    # original module, so the unpatched code refuted the fix with its own finding at line
    # LINE, "new". Now the patched code runs: the narrow region moves the overflow to fc2's
    # input on the next line (refuted), and the search keeps the region that carries on
    # downstream, which verifies
    assert first.fix is not None and first.fix.verified is True
    assert first.fix.title.startswith(
        "Compute torch.nn.functional.linear in FP32 (autocast disabled); its result stays "
        "beyond float16's range"
    )
    assert (tmp_path / "nan_hunter_preflight.json").exists()


def test_callbacks_reject_bad_options_when_made() -> None:
    from nan_hunter.errors import ConfigError

    made = 0
    for name in ("transformers", "lightning"):
        module = "pytorch_lightning" if name == "lightning" else "transformers"
        try:
            __import__(module)
        except ImportError:
            continue
        callback = __import__(f"nan_hunter.integrations.{name}", fromlist=["x"]).NanHunterCallback
        with pytest.raises(ConfigError, match="unknown option 'dtyp'"):
            callback(dtyp="float16")
        with pytest.raises(ConfigError, match="on_problem"):
            callback(on_problem="explode")
        made += 1
    if not made:
        pytest.skip("neither framework is installed")
