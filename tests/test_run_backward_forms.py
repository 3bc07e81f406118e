"""``nan-hunter run`` sees the loss however the script starts its backward, once per backward,
and puts ``torch.autograd.backward`` back when it ends (also after an exception, and when two
watches in two threads close out of order)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from nan_hunter.project.config import Settings
from nan_hunter.training.attach import ScriptWatch

ORIGINAL = torch.autograd.backward


def _imported_backward(loss: torch.Tensor) -> None:
    from torch.autograd import backward  # as a script does, after nan-hunter attached

    backward(loss)


FORMS: dict[str, Callable[[torch.Tensor], None]] = {
    "loss.backward()": lambda loss: loss.backward(),
    "torch.autograd.backward(loss)": lambda loss: torch.autograd.backward(loss),
    "torch.autograd.backward([loss])": lambda loss: torch.autograd.backward([loss]),
    "torch.autograd.backward(tensors=loss)": lambda loss: torch.autograd.backward(tensors=loss),
    "from torch.autograd import backward": _imported_backward,
}


def _watch() -> ScriptWatch:
    return ScriptWatch(Settings(), lambda event: None, max_reports=0)


def _scaled_step(backward: Callable[[torch.Tensor], None], nan: bool) -> ScriptWatch:
    """One GradScaler step whose loss is NaN (or not): the scaler skips the update, so only the
    loss tells the watch that the step broke."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randn(8, 4)
    if nan:
        x[0, 0] = float("nan")
    with _watch() as watch:
        loss = model(x).pow(2).mean()
        backward(scaler.scale(loss))
        scaler.step(optimizer)
        scaler.update()
    return watch


@pytest.mark.parametrize("form", list(FORMS))
def test_a_nan_loss_is_seen_whatever_starts_the_backward(form: str) -> None:
    watch = _scaled_step(FORMS[form], nan=True)
    assert (watch.backwards, watch.problems) == (1, 1)
    assert torch.autograd.backward is ORIGINAL


@pytest.mark.parametrize("form", list(FORMS))
def test_each_backward_is_counted_once(form: str) -> None:
    watch = _scaled_step(FORMS[form], nan=False)
    assert (watch.backwards, watch.problems, watch.steps) == (1, 0, 1)


def test_a_backward_inside_a_backward_is_not_a_loss() -> None:
    """Reentrant checkpointing runs a backward of its segment inside the loss's backward."""
    from torch.utils.checkpoint import checkpoint

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    x = torch.randn(3, 4, requires_grad=True)
    with _watch() as watch:
        out = checkpoint(lambda t: model(t).sum().reshape(1), x, use_reentrant=True)
        out.sum().backward()
    assert watch.backwards == 1


def test_the_original_backward_is_back_after_an_exception() -> None:
    with pytest.raises(RuntimeError, match="the script failed"), _watch():
        assert torch.autograd.backward is not ORIGINAL
        raise RuntimeError("the script failed")
    assert torch.autograd.backward is ORIGINAL


def test_the_original_backward_is_back_when_threads_close_out_of_order() -> None:
    first, second = _watch(), _watch()
    opened = threading.Barrier(2)

    def run(watch: ScriptWatch, wait_for: threading.Event, done: threading.Event) -> None:
        watch.install()
        opened.wait()
        wait_for.wait(10)
        watch.close()
        done.set()

    first_done, second_done = threading.Event(), threading.Event()
    start = threading.Event()
    threads = [
        threading.Thread(target=run, args=(first, start, first_done)),
        threading.Thread(target=run, args=(second, first_done, second_done)),
    ]
    for thread in threads:
        thread.start()
    start.set()  # the first opened closes first: not nested
    for thread in threads:
        thread.join(10)
    assert first_done.is_set() and second_done.is_set()
    assert torch.autograd.backward is ORIGINAL
