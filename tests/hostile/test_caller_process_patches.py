"""The caller's process keeps the torch it had: scans in two threads at once, aliases and
watchers that overlap out of order, all leave torch's functions the objects they were. Run in a
fresh interpreter, so that nothing another test did stands in for what this one checks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT

SCRIPT = textwrap.dedent(
    """\
    import threading

    import torch
    import torch.amp.autocast_mode as autocast_mode
    from torch import nn
    from torch.nn.utils import clip_grad

    import nan_hunter
    from nan_hunter.precision.device_alias import DeviceAlias
    from nan_hunter.training.clipping import ClipGuard

    def torch_functions():
        return {
            "autocast.__init__": autocast_mode.autocast.__init__,
            "autocast.__enter__": autocast_mode.autocast.__enter__,
            "autocast.__exit__": autocast_mode.autocast.__exit__,
            "is_autocast_enabled": torch.is_autocast_enabled,
            "get_autocast_dtype": torch.get_autocast_dtype,
            "_cast": autocast_mode._cast,
            "utils.clip_grad_norm_": torch.nn.utils.clip_grad_norm_,
            "utils.clip_grad_value_": torch.nn.utils.clip_grad_value_,
            "clip_grad.clip_grad_norm_": clip_grad.clip_grad_norm_,
        }

    before = torch_functions()

    def changed():
        return sorted(k for k, v in torch_functions().items() if v is not before[k])

    # 1. two aliases in two threads, closed in the order they opened
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with DeviceAlias():
            a_in.set()
            b_in.wait()
        a_out.set()

    def second():
        a_in.wait()
        with DeviceAlias():
            b_in.set()
            a_out.wait()
            # the other alias is gone, this one still maps "cuda" to the CPU
            with torch.autocast("cuda", dtype=torch.bfloat16):
                seen["mapped"] = torch.is_autocast_enabled("cpu")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"mapped": True}, seen
    assert changed() == [], ("aliases", changed())

    # 2. two scans at once in two threads
    barrier = threading.Barrier(2, timeout=60)

    class Meet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.met = False

        def forward(self, x):
            if not self.met:  # both scans are inside their passes here
                self.met = True
                barrier.wait()
            return self.fc(x)

    errors = []

    def scan():
        try:
            nan_hunter.scan(Meet(), torch.randn(2, 4), verify_fixes=False)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=scan) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors
    assert changed() == [], ("scans", changed())

    # 3. two clip guards removed in the order they were installed
    p = nn.Parameter(torch.ones(3))
    calls = []
    one = ClipGuard([p], lambda: True, lambda name, where: calls.append(("one", name)))
    two = ClipGuard([p], lambda: True, lambda name, where: calls.append(("two", name)))
    one.install()
    two.install()
    p.grad = torch.ones(3)
    torch.nn.utils.clip_grad_norm_([p], 1.0)
    one.remove()
    torch.nn.utils.clip_grad_norm_([p], 1.0)
    two.remove()
    torch.nn.utils.clip_grad_norm_([p], 1.0)
    assert calls == [("one", "clip_grad_norm_"), ("two", "clip_grad_norm_"),
                     ("two", "clip_grad_norm_")], calls
    assert changed() == [], ("clip guards", changed())
    print("ok")
    """
)


def test_threads_and_overlapping_patches_leave_torch_as_it_was() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
