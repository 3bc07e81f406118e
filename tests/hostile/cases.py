"""The hostile-input catalog: one entry per case, grouped by what it checks.

Each case is a working folder (``files``), a command line, the exit code, and for exit 2 the one
``nan-hunter: error:`` line (a regex). ``tests/hostile/test_catalog.py`` runs every case and checks
that every file in the folder is byte-identical afterwards (mode bits too) except ``written``.
Cases with ``child=True`` run the real scan process (a torch import each, ~2-4 s); the others run
the same code in the test's process (``NAN_HUNTER_IN_PROCESS=1``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nan_hunter.core import safe_write
from tests.conftest import EXAMPLES

Setup = Callable[[Path, pytest.MonkeyPatch], None]
Check = Callable[[Path, Any], None]


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    code: int
    error: str | None = None
    """Regex the single ``nan-hunter: error:`` line must match (required for exit 2)."""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    written: frozenset[str] = frozenset()
    """Files the user named (or --fix writes): allowed to change or appear."""
    child: bool = False
    alone: bool = True
    """The error line is all of stderr (False when the model itself prints)."""
    setup: Setup | None = None
    check: Check | None = None
    root: bool = False
    """Needs root (changes a file's owner)."""


def model(
    forward: str = "",
    top: str = "",
    build: str = "",
    batch: str = "torch.randn(2, 4)",
    extra: str = "",
) -> str:
    """A small model file; each argument is code placed at that spot."""
    return (
        "import torch\nfrom torch import nn\n"
        + textwrap.dedent(top)
        + "\n\nclass Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        + textwrap.indent(textwrap.dedent(forward) or "pass", "        ")
        + "\n        return self.fc(x)\n\n\n"
        "def build_model():\n"
        + textwrap.indent(textwrap.dedent(build) or "pass", "    ")
        + "\n    return Net()\n\n\n"
        f"def sample_batch():\n    return {batch}\n"
        + textwrap.dedent(extra)
    )


CLEAN = model()
MATRIX = (EXAMPLES / "matrix_inverse.py").read_text(encoding="utf-8")
"""A model with an NH101 finding and a verified safe fix."""
SCAN = ("scan", "model.py")


# --- helpers for setup and checks -----------------------------------------------------------


def _enospc_on(call: int) -> Setup:
    """The disk fills while the ``call``-th file written is flushed (1: the backup)."""

    def setup(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        real = os.fsync
        calls: list[int] = []

        def fsync(fd: int) -> None:
            if not _is_file(fd):  # the folder's fsync
                return real(fd)
            calls.append(fd)
            if len(calls) == call:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd)

        monkeypatch.setattr(safe_write.os, "fsync", fsync)

    return setup


def _is_file(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _chmod(name: str, mode: int) -> Setup:
    def setup(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        (folder / name if name else folder).chmod(mode)

    return setup


def _chown(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    os.chown(folder / "model.py", 4321, 4321)
    (folder / "model.py").chmod(0o640)


def _symlink(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "link.txt").symlink_to("model.py")


def _fixed(folder: Path, result: Any) -> None:
    assert 'with torch.autocast(device_type="cuda", enabled=False):' in (
        folder / "model.py"
    ).read_text()


def _backup_is(name: str) -> Check:
    def check(folder: Path, result: Any) -> None:
        _fixed(folder, result)
        assert (folder / name).read_text() == MATRIX
        assert "original kept as " + name in result.stderr

    return check


def _owner_and_mode_kept(folder: Path, result: Any) -> None:
    _fixed(folder, result)
    for name in ("model.py", "model.py.orig"):
        info = (folder / name).stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (4321, 4321, 0o640)


def _one_backup(folder: Path, result: Any) -> None:
    assert sorted(p.name for p in folder.iterdir()) == ["model.py", "model.py.orig"]
    assert (folder / "model.py.orig").read_text() == MATRIX


def _json_stdout(folder: Path, result: Any) -> None:
    json.loads(result.stdout)  # nothing the model printed is mixed in
    assert "printed by the model" in result.stderr


def _report_here(folder: Path, result: Any) -> None:
    assert (folder / "report.json").is_file()
    json.loads((folder / "report.json").read_text())
    assert not (folder / "sub" / "report.json").exists()


def _stdout_has(text: str) -> Check:
    def check(folder: Path, result: Any) -> None:
        assert text in result.stdout

    return check


def _internal_bug(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nan_hunter.api

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug of ours\nwith a second line")

    monkeypatch.setattr(nan_hunter.api, "scan_target", broken)


def _other_model_scanned(folder: Path, result: Any) -> None:
    assert "models/a.py" in result.stdout  # one model ending its process spoils no other


def _junit_stdout(folder: Path, result: Any) -> None:
    import xml.etree.ElementTree as ET

    assert ET.fromstring(result.stdout.encode()).tag == "testsuite"
    assert "printed by the model" in result.stderr
    assert "nan-hunter: trained 2 step(s)" in result.stderr


def _valid_json(folder: Path, result: Any) -> None:
    json.loads(result.stdout)


def gone(pid: int) -> bool:
    """``pid`` has exited (a zombie not yet reaped counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" in status.read_text()


def _sleeper_gone(folder: Path, result: Any) -> None:
    pid = int((folder / "sleeper.pid").read_text())
    deadline = time.monotonic() + 10
    while not gone(pid):
        assert time.monotonic() < deadline, "a process the model started outlived the scan"
        time.sleep(0.1)


def _sleeper_stopped(folder: Path, result: Any) -> None:
    json.loads(result.stdout)
    _sleeper_gone(folder, result)


def _dev_null_intact(folder: Path, result: Any) -> None:
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def _report_link(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "link.txt").symlink_to("reports/r.txt")


def _link_kept(folder: Path, result: Any) -> None:
    assert (folder / "link.txt").is_symlink()
    assert "clean:" in (folder / "reports" / "r.txt").read_text()


def _first_line_is_error(folder: Path, result: Any) -> None:
    assert result.stderr.startswith("nan-hunter: error: ")


def _alias_bomb() -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 12):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join([*lines, "select: *l"]) + "\n"


def _pickle_payload() -> bytes:
    import pickle

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("touch pwned",))

    return pickle.dumps({"w": Evil()})


HELPER = "SCALE = 1.0\n"
BREAKS_NAN_HUNTER = "import nan_hunter.api\nnan_hunter.api.scan_target = lambda *a, **k: 1 / 0\n"
"""A model that breaks nan-hunter itself: stands for a bug of ours inside the scan process."""
BREAKS_THE_GRADIENT_LOG = "import nan_hunter.precision.gradients as g\ng.fill_row = None\n"
"""... a bug of ours that strikes while the model's backward runs: not the model's error."""
HANGS = model(build="import time\ntime.sleep(600)")
LATIN1 = ("# -*- coding: latin-1 -*-\n# caf\xe9, na\xefve\n" + MATRIX).encode("latin-1")
CRLF = MATRIX.replace("\n", "\r\n").encode()


# --- text from the model in CI logs, pull-request comments and terminals -------------------

INJECTED = "x\n::error title=Injected::by the model\n"
"""A workflow command the model's text would start on a line of its own."""
TERMINAL_CONTROLS = "\x1b]52;c;cHduZWQ=\x07\x1b]0;title\x07\x1b[2J\x9b1m"
"""An OSC 52 clipboard write, a window title, a screen clear and an 8-bit CSI."""
RAW_HTML = "<script>alert(1)</script><img src=x onerror=alert(1)>"
MARKDOWN_BREAKOUT = f"a\n\n# pwned\n\n{RAW_HTML}"


def _overflow_in(module_name: str) -> str:
    """A model whose submodule ``module_name`` overflows FP16 (NH1xx in that module)."""
    return (
        "import torch\nfrom torch import nn\n\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        big = nn.Linear(4, 4)\n"
        "        nn.init.constant_(big.weight, 1e5)\n"
        f"        self.add_module({module_name!r}, big)\n\n"
        "    def forward(self, x):\n"
        f"        return getattr(self, {module_name!r})(x)\n\n\n"
        "def build_model():\n    return Net()\n\n\n"
        "def sample_batch():\n    return torch.ones(2, 4)\n"
    )


def _only_our_workflow_commands(folder: Path, result: Any) -> None:
    for line in result.stdout.splitlines():
        assert line.startswith(("::error ", "::warning ", "::notice ", "nan-hunter: ")), line


def _no_terminal_controls(folder: Path, result: Any) -> None:
    for stream in (result.stdout, result.stderr):
        assert not any(c in stream for c in "\x1b\x07\x9b"), repr(stream[:300])
    assert "\\x1b]52" in result.stdout + result.stderr  # shown, not sent


def _html_of_markdown_is_ours(folder: Path, result: Any) -> None:
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(result.stdout)
    assert "<script" not in html and "<img" not in html, html
    assert "<h1>pwned" not in html


def _error_line_capped(folder: Path, result: Any) -> None:
    line = result.stderr.splitlines()[0]
    assert len(line) < 2300, len(line)


# --- what a scan did not check ----------------------------------------------------------------

DETACHED_LOSS = model(extra="\n\ndef loss_fn(output, batch):\n    return output.detach().sum()\n")


def _json_says(*, not_checked: str | None, backward: bool) -> Check:
    def check(folder: Path, result: Any) -> None:
        report = json.loads(result.stdout)
        notes = report["summary"]["not_checked"]
        assert (notes == []) if not_checked is None else (not_checked in " ".join(notes)), notes
        assert notes == [n for n in report["target"]["notes"] if n in notes]
        assert (report["target"]["loss_scaling"] is not None) is backward

    return check


# --- never green on nothing: helpers ---------------------------------------------------------

TOOL = "[tool.nan-hunter]\n"
SUPPRESSED_MATRIX = MATRIX.replace(
    "codes = torch.matmul(dtd_inv, z)",
    "codes = torch.matmul(dtd_inv, z)  # nan-hunter: ignore[NH101] -- inputs are bounded",
)
CR_ONLY = SUPPRESSED_MATRIX.replace("\n", "\r").encode()
"""Old Mac line ends: Python reads a lone \\r as a line end."""
MISSPELLED_CODE = SUPPRESSED_MATRIX.replace("ignore[NH101]", "ignore[NH1O1]")
"""``NH1O1``: a letter O for the zero."""
NO_GRADIENT_REACHED = model(forward="return (x * 2).sum()",
                            batch="torch.randn(2, 4, requires_grad=True)")
"""The loss never reaches the parameters: none gets a gradient."""
FROZEN = model(build="net = Net()\nnet.requires_grad_(False)\nreturn net")
WITHOUT_PARAMETERS = (
    "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
    "    def forward(self, x):\n        return (x * 2).sum()\n\n\n"
    "def build_model():\n    return Net()\n\n\n"
    "def sample_batch():\n    return torch.randn(2, 4, requires_grad=True)\n"
)
LIBRARY = "nh_hostile_gramlib"
LIBRARY_SOURCE = (
    "import torch\n\n\ndef gram(x):\n"
    "    return x @ x.transpose(-2, -1)  # nan-hunter: ignore[NH] -- the library's own judgement\n"
)
CUSTOM_FUNCTION_BACKWARD = (
    "import torch\nfrom torch import nn\n\n\n"
    "class Steep(torch.autograd.Function):\n"
    "    @staticmethod\n"
    "    def forward(ctx, x):\n"
    "        ctx.save_for_backward(x)\n"
    "        return x / (x * x + 1.0)\n\n"
    "    @staticmethod\n"
    "    def backward(ctx, grad):\n"
    "        (x,) = ctx.saved_tensors\n"
    "        return grad * 1e5 / (x * x + 1e-2) * 1e-3\n\n\n"
    "class Net(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = nn.Linear(4, 4)\n"
    "        nn.init.constant_(self.fc.weight, 0.01)\n"
    "        nn.init.zeros_(self.fc.bias)\n\n"
    "    def forward(self, x):\n"
    "        return Steep.apply(self.fc(x))\n\n\n"
    "def build_model():\n    return Net()\n\n\n"
    "def sample_batch():\n    return torch.ones(2, 4)\n"
)
"""A custom Function whose own backward overflows FP16 (the linear before it only receives
the inf)."""
LIBRARY_USER = (
    f"import torch\nfrom torch import nn\n\nimport {LIBRARY}\n\n\n"
    "class Style(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n        self.proj = nn.Linear(16, 16)\n\n"
    "    def forward(self, x):\n        h = self.proj(x) * 300.0\n"
    f"        g = {LIBRARY}.gram(h)\n"
    "        return g.mean(-1) / (g.abs().amax() + 1.0)\n\n\n"
    "def build_model():\n    torch.manual_seed(0)\n    return Style()\n\n\n"
    "def sample_batch():\n    torch.manual_seed(0)\n    return torch.randn(2, 8, 16)\n"
)
"""A model whose culprit op runs in an installed library, called from the user's file."""


def _installed_library(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``venv/site-packages`` on the path; the library imported fresh and forgotten after."""
    monkeypatch.syspath_prepend(str(folder / "venv" / "site-packages"))
    monkeypatch.setitem(sys.modules, LIBRARY, None)  # undone last: the name is gone after
    monkeypatch.delitem(sys.modules, LIBRARY)


def _suppressed(folder: Path, result: Any) -> None:
    assert "1 suppressed" in result.stdout, result.stdout


def _unknown_code_noted(folder: Path, result: Any) -> None:
    assert "ignore[NH1O1] names an unknown rule code 'NH1O1', so NH101 is not suppressed" in (
        " ".join(result.stdout.split())
    ), result.stdout


def _library_finding_active(folder: Path, result: Any) -> None:
    assert "error[NH102]" in result.stdout and "suppressed" not in result.stdout, result.stdout


HIDDEN_MATMUL = model(
    build="net = Net()\nnet.big = torch.nn.Parameter(torch.full((4, 4), 3e4))\nreturn net",
    forward="with torch._C.DisableTorchFunction():\n    return self.fc(x) @ self.big",
)
"""A matmul that overflows FP16 where the tracer cannot see it."""
HIDDEN_IN_A_SUBMODULE = (
    "import torch\nfrom torch import nn\n\n\n"
    "class Gram(nn.Module):\n"
    "    def forward(self, h):\n"
    "        with torch._C.DisableTorchFunction():\n"
    "            return h @ h.t() * 1e5\n\n\n"
    "class Net(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n"
    "        self.fc = nn.Linear(4, 4)\n        self.gram = Gram()\n\n"
    "    def forward(self, x):\n        return self.gram(self.fc(x)).mean()\n\n\n"
    "def build_model():\n    return Net()\n\n\n"
    "def sample_batch():\n    return torch.randn(2, 4)\n"
)
"""A hidden op in a submodule: the finding names it."""

DEVICE_WRAPPER = model(
    build="net = Net()\nnet.fc.weight.data.fill_(3e3)\nreturn net",
    forward="with torch.autocast('cuda', enabled=x.is_cuda):  # FP32 on the CPU\n"
    "    return (self.fc(x) @ self.fc(x).t()).sum()",
)
"""A model-file autocast wrapper that keeps CPU runs in FP32: the CUDA path overflows."""
CPU_EARLY_RETURN = model(
    forward="if x.device.type == 'cpu':\n    return self.fc(x).float()",
)
"""A forward that takes a CPU-only early return."""
AUTOCAST_BY_DEVICE = model(
    forward="with torch.autocast(device_type=x.device.type, enabled=False):\n"
    "    return self.fc(x.float())",
)
"""Passing the device on to autocast is not a branch: clean."""


LIARS = """
_OWN = {n: (getattr(torch, n), getattr(torch.Tensor, n))
        for n in ("isfinite", "isnan", "isinf", "aminmax")}


def lie():
    torch.isfinite = lambda t: torch.ones_like(t, dtype=torch.bool)
    torch.isnan = torch.isinf = lambda t: torch.zeros_like(t, dtype=torch.bool)
    torch.aminmax = lambda t, **k: (torch.zeros(()), torch.zeros(()))
    for n in _OWN:
        setattr(torch.Tensor, n, lambda self, *a, _n=n, **k: getattr(torch, _n)(self, *a, **k))


def put_back():
    for n, (function, method) in _OWN.items():
        setattr(torch, n, function)
        setattr(torch.Tensor, n, method)
"""
"""A model file's replacements of the functions a NaN check uses: everything reads finite."""

AUTOCAST_LIAR = """
class _Autocast(torch.autocast):
    def __init__(self, device_type, *args, enabled=True, **kwargs):
        super().__init__(device_type, *args, enabled=enabled and device_type == "cuda", **kwargs)


torch.autocast = torch.amp.autocast = _Autocast
"""
"""An autocast that passes CUDA through and does nothing on a CPU."""


CASES: list[Case] = [
    # --- text from the model in CI outputs and terminals -------------------------------------
    Case("github-summary-of-a-file-name-with-a-newline",
         ("scan", f"ok{INJECTED}y.py", "--format", "github"), 0,
         files={f"ok{INJECTED}y.py": CLEAN}, check=_only_our_workflow_commands),
    Case("github-annotation-of-a-module-name-with-a-newline", (*SCAN, "--format", "github"), 1,
         files={"model.py": _overflow_in(INJECTED)}, check=_only_our_workflow_commands),
    Case("github-failed-file-message-with-a-newline", ("scan", "models", "--format", "github"), 2,
         r"models/b\.py: .*RuntimeError", files={"models/a.py": CLEAN,
                "models/b.py": model(build=f"raise RuntimeError({INJECTED!r})")},
         check=_only_our_workflow_commands, alone=False),
    Case("markdown-module-name-leaves-no-code-span", (*SCAN, "--format", "markdown"), 1,
         files={"model.py": _overflow_in(MARKDOWN_BREAKOUT)}, check=_html_of_markdown_is_ours),
    Case("markdown-not-scanned-message-is-not-html", ("scan", "models", "--format", "markdown"),
         2, r"models/b\.py: .*RuntimeError", files={"models/a.py": CLEAN,
                   "models/b.py": model(build=f"raise RuntimeError({RAW_HTML!r})")},
         check=_html_of_markdown_is_ours, alone=False),
    Case("text-report-source-comment-with-terminal-controls", SCAN, 1,
         files={"model.py": MATRIX.replace(
             "codes = torch.matmul(dtd_inv, z)",
             f"codes = torch.matmul(dtd_inv, z)  # {TERMINAL_CONTROLS}")},
         setup=lambda folder, mp: mp.setenv("NO_COLOR", "1"), check=_no_terminal_controls),
    Case("text-report-module-name-with-terminal-controls", SCAN, 1,
         files={"model.py": _overflow_in(TERMINAL_CONTROLS)}, check=_no_terminal_controls),
    Case("error-line-with-terminal-controls", SCAN, 2, r"RuntimeError during forward: \\x1b\]52",
         files={"model.py": model(forward=f"raise RuntimeError({TERMINAL_CONTROLS!r})")},
         check=_no_terminal_controls),
    Case("error-line-of-a-megabyte-message-is-capped", SCAN, 2, r"\.\.\. \(\d{6,} more\)",
         files={"model.py": model(forward="raise RuntimeError('x' * 1_000_000)")},
         check=_error_line_capped),
    Case("error-line-of-a-megabyte-message-is-capped-child", SCAN, 2, r"\.\.\. \(\d{6,} more\)",
         files={"model.py": model(forward="raise RuntimeError('x' * 1_000_000)")},
         check=_error_line_capped, child=True),
    # --- torch's checks replaced by the model file: never "clean" on a liar (issue 35) ------
    # (child: the replacements stay in the scan process, never in the test's)
    Case("statistics-replaced-at-import-are-refused", SCAN, 2,
         r"^nan-hunter: error: model\.py replaced torch\.isfinite, torch\.isnan, torch\.isinf, "
         r"torch\.aminmax, torch\.Tensor\.isfinite, torch\.Tensor\.isnan, torch\.Tensor\.isinf, "
         r"torch\.Tensor\.aminmax during its import, build_model\(\) and sample_batch\(\): "
         r"nan-hunter checks values with torch's own functions",
         files={"model.py": model(top=LIARS + "lie()\n", forward="x = torch.log(x)")},
         child=True),
    Case("autocast-replaced-at-import-is-refused", SCAN, 2,
         r"model\.py replaced torch\.autocast, torch\.amp\.autocast during its import",
         files={"model.py": model(top=AUTOCAST_LIAR, forward="x = torch.log(x)")}, child=True),
    Case("autocast-enter-replaced-in-build-is-refused", SCAN, 2,
         r"model\.py replaced torch\.autocast\.__enter__ during its import, build_model\(\)",
         files={"model.py": model(build="torch.autocast.__enter__ = lambda self: self",
                                  forward="x = torch.log(x)")}, child=True),
    Case("statistics-replaced-in-forward-and-put-back-still-see-the-nan", SCAN, 1,
         files={"model.py": model(top=LIARS, forward="lie()\nx = torch.log(x)\nx = x * 1\n"
                                                      "put_back()")},
         check=_stdout_has("error[NH301] nan: torch.log gets"), child=True),
    Case("statistics-replaced-in-forward-and-left-are-refused", SCAN, 2,
         r"model\.py replaced torch\.isfinite, .* during the scan:",
         files={"model.py": model(top=LIARS, forward="lie()\nx = torch.log(x)")}, child=True),
    # --- what a scan did not check: never "clean" over an unanalysed backward ---------------
    Case("backward-runs-when-the-model-file-turns-gradients-off", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(top="torch.set_grad_enabled(False)\n")}, child=True,
         check=_json_says(not_checked=None, backward=True)),
    Case("loss-detached-from-every-parameter-is-not-clean", (*SCAN, "--format", "json"), 1,
         files={"model.py": DETACHED_LOSS},
         check=_json_says(not_checked="detached from every parameter", backward=False)),
    Case("no-trainable-parameter-is-not-clean", (*SCAN, "--format", "json"), 1,
         files={"model.py": model(build="pass").replace(
             "    return Net()", "    return Net().requires_grad_(False)")},
         check=_json_says(not_checked="no parameter of the model requires a gradient",
                          backward=False)),
    Case("no-backward-says-what-was-not-checked", (*SCAN, "--no-backward", "--format", "json"), 0,
         files={"model.py": CLEAN},
         check=_json_says(not_checked="no backward was asked for", backward=False)),
    Case("no-backward-text-header-says-so", (*SCAN, "--no-backward"), 0,
         files={"model.py": CLEAN},
         check=_stdout_has("not checked  the backward was not analysed")),
    # ops hidden from the tracer are a gap in what was checked (said, a warning), not evidence
    # that the model breaks: exit 0 unless warnings fail the scan
    Case("ops-hidden-from-the-tracer-are-said-not-clean", (*SCAN, "--format", "json"), 0,
         files={"model.py": HIDDEN_MATMUL},
         check=_json_says(not_checked="ops the tracer did not see", backward=True)),
    Case("ops-hidden-from-the-tracer-fail-on-warning", (*SCAN, "--fail-on", "warning"), 1,
         files={"model.py": HIDDEN_MATMUL}, check=_stdout_has("warning[NH003] not_checked")),
    Case("autocast-wrapper-keeping-cpu-fp32-is-not-clean", (*SCAN, "--format", "json"), 1,
         files={"model.py": DEVICE_WRAPPER},
         check=_json_says(not_checked="the path a CUDA run takes", backward=True)),
    Case("cpu-only-early-return-is-not-clean", SCAN, 1, files={"model.py": CPU_EARLY_RETURN},
         check=_stdout_has("error[NH004] not_checked: the forward asked which device")),
    Case("autocast-following-the-device-is-clean", SCAN, 0,
         files={"model.py": AUTOCAST_BY_DEVICE}, check=_stdout_has("clean:")),
    Case("ops-hidden-in-a-submodule-name-it", SCAN, 0, files={"model.py": HIDDEN_IN_A_SUBMODULE},
         check=_stdout_has("warning[NH003] not_checked: the output of gram was computed")),
    # --- writes: --fix, backups, -o and --patch never lose or clobber a file ----------------
    Case("fix-backup-then-fix", (*SCAN, "--fix"), 0, files={"model.py": MATRIX},
         written=frozenset({"model.py", "model.py.orig"}), check=_backup_is("model.py.orig")),
    Case("fix-keeps-earlier-backup", (*SCAN, "--fix"), 0,
         files={"model.py": MATRIX, "model.py.orig": "stub left by a full disk"},
         written=frozenset({"model.py", "model.py.orig.1"}), check=_backup_is("model.py.orig.1")),
    Case("fix-keeps-two-earlier-backups", (*SCAN, "--fix"), 0,
         files={"model.py": MATRIX, "model.py.orig": "v0", "model.py.orig.1": "v1"},
         written=frozenset({"model.py", "model.py.orig.2"}), check=_backup_is("model.py.orig.2")),
    Case("fix-enospc-on-backup", (*SCAN, "--fix"), 2, "no space left on the device",
         files={"model.py": MATRIX}, setup=_enospc_on(1)),
    Case("fix-enospc-on-source", (*SCAN, "--fix"), 2, "no space left on the device",
         files={"model.py": MATRIX}, setup=_enospc_on(2)),
    Case("fix-no-backup-enospc", (*SCAN, "--fix", "--no-backup"), 2, "no space left",
         files={"model.py": MATRIX}, setup=_enospc_on(1)),
    Case("fix-read-only-file", (*SCAN, "--fix"), 2, r"model\.py: the file is read-only",
         files={"model.py": MATRIX}, setup=_chmod("model.py", 0o444)),
    Case("fix-read-only-folder", (*SCAN, "--fix"), 2, r"the folder .* is read-only",
         files={"model.py": MATRIX}, setup=_chmod("", 0o555)),
    Case("fix-keeps-owner-and-mode", (*SCAN, "--fix"), 0, files={"model.py": MATRIX},
         written=frozenset({"model.py", "model.py.orig"}), setup=_chown,
         check=_owner_and_mode_kept, root=True),
    Case("fix-all-one-backup-per-run", (*SCAN, "--fix-all"), 0, files={"model.py": MATRIX},
         written=frozenset({"model.py", "model.py.orig"}), check=_one_backup),
    Case("fix-no-backup", (*SCAN, "--fix", "--no-backup"), 0, files={"model.py": MATRIX},
         written=frozenset({"model.py"}), check=_fixed),
    Case("report-over-model-file", (*SCAN, "-o", "model.py"), 2,
         r"refusing to write the report to .*model\.py: it is the model file",
         files={"model.py": MATRIX}),
    Case("patch-over-model-file", (*SCAN, "--patch", "model.py"), 2,
         r"refusing to write the patch to .*model\.py: it is the model file",
         files={"model.py": MATRIX}),
    Case("report-over-model-via-symlink", (*SCAN, "-o", "link.txt"), 2,
         "it is the model file", files={"model.py": MATRIX}, setup=_symlink),
    Case("report-over-weights", (*SCAN, "--weights", "w.pt", "-o", "w.pt"), 2,
         "it is the --weights file", files={"model.py": CLEAN, "w.pt": b"x"}),
    Case("report-over-batch-file", (*SCAN, "--batch-file", "b.pt", "-o", "b.pt"), 2,
         "it is the --batch-file file", files={"model.py": CLEAN, "b.pt": b"x"}),
    Case("report-over-config", (*SCAN, "--config", "c.yaml", "-o", "c.yaml"), 2,
         "it is the --config file", files={"model.py": CLEAN, "c.yaml": "dtype: float16\n"}),
    Case("report-over-imported-sibling", (*SCAN, "-o", "helper_a.py"), 2,
         r"helper_a\.py: it is a file the scan imported",
         files={"model.py": model(top="import helper_a"), "helper_a.py": HELPER}),
    Case("patch-over-imported-package-file", (*SCAN, "--patch", "pkg_b/__init__.py"), 2,
         "it is a file the scan imported",
         files={"model.py": MATRIX.replace("import torch\n", "import torch\nimport pkg_b\n", 1),
                "pkg_b/__init__.py": HELPER}),
    Case("report-after-model-chdir", (*SCAN, "--format", "json", "-o", "report.json"), 0,
         files={"model.py": model(build="import os\nos.makedirs('sub', exist_ok=True)\n"
                                        "os.chdir('sub')")},
         written=frozenset({"report.json"}), check=_report_here),
    Case("report-after-model-chdir-child", (*SCAN, "--format", "json", "-o", "report.json"), 0,
         files={"model.py": model(build="import os\nos.makedirs('sub', exist_ok=True)\n"
                                        "os.chdir('sub')")},
         written=frozenset({"report.json"}), check=_report_here, child=True),
    Case("report-into-missing-folder", (*SCAN, "-o", "nowhere/report.txt"), 2,
         r"cannot write .*nowhere/report\.txt", files={"model.py": CLEAN}),
    Case("report-onto-a-folder", (*SCAN, "-o", "sub"), 2, "not a regular file",
         files={"model.py": CLEAN, "sub/keep.txt": "x"}),
    Case("report-over-read-only-file", (*SCAN, "-o", "old.txt"), 2, "the file is read-only",
         files={"model.py": CLEAN, "old.txt": "old report"}, setup=_chmod("old.txt", 0o444)),
    Case("report-replaces-own-old-report", (*SCAN, "-o", "report.txt"), 0,
         files={"model.py": CLEAN, "report.txt": "old"}, written=frozenset({"report.txt"})),
    Case("patch-written-where-asked", (*SCAN, "--patch", "fix.diff"), 1,
         files={"model.py": MATRIX}, written=frozenset({"fix.diff"})),
    # --- the scan process: the model cannot end, hang or corrupt the tool's run --------------
    Case("sys-exit-0-in-forward", SCAN, 2,
         r"called sys\.exit\(0\) while running Net\.forward \(float16 autocast pass.*\); "
         "nothing was scanned",
         files={"model.py": model(forward="import sys\nsys.exit(0)")}, child=True),
    Case("sys-exit-3-at-import", SCAN, 2, r"called sys\.exit\(3\) while importing model\.py",
         files={"model.py": model(top="import sys\nsys.exit(3)")}, child=True),
    Case("sys-exit-text-in-build", SCAN, 2,
         r"called sys\.exit\('bye'\) while calling build_model\(\)",
         files={"model.py": model(build="raise SystemExit('bye')")}, child=True),
    Case("os-exit-0-in-forward", SCAN, 2,
         r"exited with status 0 before reporting .* while running Net\.forward",
         files={"model.py": model(forward="import os\nos._exit(0)")}, child=True),
    Case("segfault-in-forward", SCAN, 2, r"crashed \(SIGSEGV.* while running Net\.forward",
         files={"model.py": model(forward="import ctypes\nctypes.string_at(0)")}, child=True),
    Case("killed-like-oom-in-submodule", SCAN, 2,
         r"was killed \(SIGKILL: out of memory.* while running the forward of fc \(Linear\)",
         files={"model.py": model(
             top="import os, signal\n",
             extra="\n\ndef _die(module, args):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
             build="pass").replace("    return Net()", "    net = Net()\n"
                                   "    net.fc.register_forward_pre_hook(_die)\n    return net")},
         child=True),
    Case("hang-with-timeout", (*SCAN, "--timeout", "8"), 2,
         r"did not finish within 8 s \(--timeout\) and was stopped",
         files={"model.py": HANGS}, child=True),
    Case("prints-do-not-corrupt-json", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(forward="print('printed by the model')",
                                  top="print('printed by the model at import')")},
         child=True, check=_json_stdout),
    Case("fd-level-writes-do-not-corrupt-sarif", (*SCAN, "--format", "sarif"), 0,
         files={"model.py": model(forward="import os\nos.write(1, b'printed by the model\\n')")},
         child=True, check=_json_stdout),
    Case("prints-do-not-corrupt-junit-of-training-steps",
         (*SCAN, "--format", "junit", "--steps", "2"), 0,
         files={"model.py": model(forward="print('printed by the model')")}, child=True,
         check=_junit_stdout),
    Case("model-argparse-sees-its-own-argv", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(top="import argparse\np = argparse.ArgumentParser()\n"
                                       "p.add_argument('--lr', type=float)\n"
                                       "ARGS = p.parse_args()\n"
                                       "assert ARGS.lr is None\n")},
         child=True),
    Case("model-reads-stdin", SCAN, 2, r"EOFError while calling build_model\(\)",
         files={"model.py": model(build="input('size? ')")}, child=True, alone=False,
         check=_first_line_is_error),
    Case("warnings-come-after-the-error-line", (*SCAN, "--batch-file", "absent.pt"), 2,
         "batch file not found", files={"model.py": model(
             build="import warnings\nwarnings.warn('a torch-like UserWarning')")},
         child=True, alone=False, check=_first_line_is_error),
    Case("torch-load-warnings-are-not-the-models-output", (*SCAN, "--batch-file", "b.pt"), 2,
         r"cannot load batch file .*b\.pt safely \(weights_only=True\): Invalid magic number",
         files={"model.py": model(extra="\n\ndef loss_fn(output, batch):\n    return 1.0\n"),
                "b.pt": b"\x80\x04K\x03."},  # pickle protocol 4: torch warns, then fails
         child=True),
    Case("forward-recursing-through-ops", SCAN, 2,
         r"the model's forward recursed too deep \(RecursionError\) at \S*model\.py:4$",
         files={"model.py": model(top="def spin(x):\n    return spin(x + 1)\n",
                                  forward="x = spin(x)")}),
    Case("forward-recursing-in-python", SCAN, 2,
         r"the model's forward recursed too deep \(RecursionError\) at \S*model\.py:4$",
         files={"model.py": model(top="def count(n):\n    return count(n + 1)\n",
                                  forward="count(0)")}),
    Case("unprintable-exception-in-forward", SCAN, 2, r"its __str__ raises",
         files={"model.py": model(forward="raise Bad()", top="class Bad(Exception):\n"
                                  "    def __str__(self):\n        raise RuntimeError('no')\n")},
         child=True),
    Case("internal-error-is-one-line", SCAN, 2,
         r"internal error: ValueError: a bug of ours \(use --debug for a traceback\)$",
         files={"model.py": CLEAN}, setup=_internal_bug),
    Case("internal-error-in-scan-process", SCAN, 2,
         r"internal error: ZeroDivisionError: division by zero \(use --debug for a traceback\)$",
         files={"model.py": model(top=BREAKS_NAN_HUNTER)}, child=True),
    Case("internal-error-during-the-backward", SCAN, 2,
         r"internal error: TypeError: 'NoneType' object is not callable \(use --debug for a "
         r"traceback\)$", files={"model.py": model(top=BREAKS_THE_GRADIENT_LOG)}, child=True),
    # --- options: one line, exit 2, before any model code runs -------------------------------
    Case("select-unknown-code", (*SCAN, "--select", "NX101"), 2,
         r"command line: 'select' has an unknown rule code 'NX101'", files={"model.py": MATRIX}),
    Case("ignore-unknown-code", (*SCAN, "--ignore", "E501"), 2,
         "'ignore' has an unknown rule code 'E501'", files={"model.py": MATRIX}),
    Case("select-empty-code", (*SCAN, "--select", ""), 2, "unknown rule code ''",
         files={"model.py": MATRIX}),
    Case("select-too-long-code", (*SCAN, "--select", "NH1011"), 2,
         "unknown rule code 'NH1011'", files={"model.py": MATRIX}),
    Case("select-lowercase-prefix-works", (*SCAN, "--select", "nh1"), 1,
         files={"model.py": MATRIX}, check=_stdout_has("error[NH101]")),
    Case("fail-on-unknown", (*SCAN, "--fail-on", "fatal"), 2, r"invalid value for '--fail-on'",
         files={"model.py": CLEAN}),
    Case("format-xml", (*SCAN, "--format", "xml"), 2, r"invalid value for '--format': 'xml'",
         files={"model.py": CLEAN}),
    Case("steps-0", (*SCAN, "--steps", "0"), 2, r"invalid value for '--steps'",
         files={"model.py": CLEAN}),
    Case("rounds-0", (*SCAN, "--fix-all", "--rounds", "0"), 2, r"invalid value for '--rounds'",
         files={"model.py": CLEAN}),
    Case("timeout-negative", (*SCAN, "--timeout", "-1"), 2,
         r"'--timeout': -1 is not a positive number of seconds", files={"model.py": CLEAN}),
    Case("timeout-zero", (*SCAN, "--timeout", "0"), 2, "not a positive number of seconds",
         files={"model.py": CLEAN}),
    Case("timeout-not-a-number", (*SCAN, "--timeout", "soon"), 2,
         r"invalid value for '--timeout'", files={"model.py": CLEAN}),
    Case("dtype-float8", (*SCAN, "--dtype", "float8"), 2, r"invalid value for '--dtype'",
         files={"model.py": CLEAN}),
    Case("unknown-option", (*SCAN, "--fix-al"), 2, r"no such option: --fix-al",
         files={"model.py": CLEAN}),
    Case("missing-model-argument", ("scan",), 2, r"missing argument 'paths'"),
    Case("explain-without-code", ("explain",), 2, r"missing argument 'code'"),
    Case("grad-scale-negative", (*SCAN, "--grad-scale", "-5"), 2,
         r"'grad_scale' must be none, dynamic or a positive number .*got '-5'",
         files={"model.py": CLEAN}),
    Case("lr-nan", (*SCAN, "--lr", "nan"), 2, "'lr' must be a finite number",
         files={"model.py": CLEAN}),
    Case("steps-with-fix", (*SCAN, "--steps", "2", "--fix"), 2,
         "--steps cannot be combined with --fix", files={"model.py": CLEAN}),
    # --- configs: bounded, one line, never the whole value -----------------------------------
    Case("config-alias-bomb", (*SCAN, "--config", "c.yaml"), 2,
         r"holds more than 10000 values once its YAML aliases are expanded",
         files={"model.py": CLEAN, "c.yaml": _alias_bomb()}),
    Case("config-not-utf8", (*SCAN, "--config", "c.yaml"), 2, r"is not UTF-8 text",
         files={"model.py": CLEAN, "c.yaml": b"dtype: caf\xe9\n"}),
    Case("config-deeply-nested", (*SCAN, "--config", "c.yaml"), 2, r"nested too deeply",
         files={"model.py": CLEAN, "c.yaml": "select: " + "[" * 5000 + "]" * 5000 + "\n"}),
    Case("config-nested-40", (*SCAN, "--config", "c.yaml"), 2, r"nested more than 32 deep",
         files={"model.py": CLEAN, "c.yaml": "select: " + "[" * 40 + "]" * 40 + "\n"}),
    Case("config-unknown-selector", (*SCAN, "--config", "c.yaml"), 2,
         r"c\.yaml: 'ignore' has an unknown rule code 'NX5'",
         files={"model.py": MATRIX, "c.yaml": "ignore: [NX5]\n"}),
    Case("config-python-tag", (*SCAN, "--config", "c.yaml"), 2, "is not valid YAML",
         files={"model.py": CLEAN, "c.yaml": "dtype: !!python/object/apply:os.system [ls]\n"}),
    Case("config-is-a-list", (*SCAN, "--config", "c.yaml"), 2, "must hold a mapping",
         files={"model.py": CLEAN, "c.yaml": "- dtype\n"}),
    Case("config-huge-wrong-value-is-shortened", (*SCAN, "--config", "c.yaml"), 2,
         r"'dtype' must be a string, got \[0, 1, 2, 3, 4, 5, \.\.\.\]$",
         files={"model.py": CLEAN, "c.yaml": f"dtype: {list(range(5000))}\n"}),
    Case("config-missing", (*SCAN, "--config", "absent.yaml"), 2,
         "cannot read config file absent.yaml", files={"model.py": CLEAN}),
    Case("config-is-a-folder", (*SCAN, "--config", "sub"), 2, "config file sub is a folder",
         files={"model.py": CLEAN, "sub/x": "x"}),
    # --- model files, batches and weights: one accurate line each ----------------------------
    Case("binary-model-file", SCAN, 2, r"model\.py is not a Python source file",
         files={"model.py": b"\x7fELF\x00\x01\x02"}),
    Case("folder-without-model-files", ("scan", "models"), 2,
         r"models: no \.py file below this folder defines build_model\(\)",
         files={"models/net.py": "x = 1\n"}),
    Case("folder-of-models-scans-each", ("scan", "models", "--format", "json"), 0,
         files={"models/a.py": CLEAN, "models/b.py": CLEAN}),
    Case("one-model-of-several-exits", ("scan", "models"), 2,
         r"models/b\.py: the model's code called sys\.exit\(0\) while importing",
         files={"models/a.py": CLEAN, "models/b.py": model(top="import sys\nsys.exit(0)")},
         child=True, check=_other_model_scanned),
    Case("missing-model-file", ("scan", "absent.py"), 2, "model file not found: absent.py"),
    Case("model-file-name-too-long", ("scan", "m" * 300 + ".py"), 2,
         r"cannot read model file m{300}\.py: "),
    Case("model-spec-name-too-long", ("scan", "m" * 300), 2, r"cannot read m{300}: "),
    Case("syntax-error", SCAN, 2, r"syntax error in .*model\.py:1",
         files={"model.py": "def broken(:\n"}),
    Case("undecodable-source", SCAN, 2, r"syntax error in .*model\.py",
         files={"model.py": b"x = '\xff\xfe'\n"}),
    Case("torchscript-model", SCAN, 2, r"is a TorchScript module",
         files={"model.py": model(build="return torch.jit.script(Net())")}),
    Case("meta-device-model", SCAN, 2, r"is on the meta device \(fc\.weight has no values\)",
         files={"model.py": model(build="return Net().to('meta')")}),
    Case("sparse-batch", SCAN, 2, r"returned a sparse_coo tensor: nan-hunter scans dense",
         files={"model.py": model(batch="torch.randn(2, 4).to_sparse()")}),
    Case("empty-batch", SCAN, 2, r"returned only empty tensors \(shape \(0, 4\)\)",
         files={"model.py": model(batch="torch.randn(0, 4)")}),
    Case("deeply-nested-batch", SCAN, 2, r"batch nested more than 32 levels deep",
         files={"model.py": model(batch="_deep()", extra="\n\ndef _deep():\n"
                                  "    x = torch.randn(2, 4)\n    for _ in range(5000):\n"
                                  "        x = [x]\n    return (x,)\n")}),
    Case("batch-holding-itself", SCAN, 2, r"or a container that holds itself",
         files={"model.py": model(batch="_loop()", extra="\n\ndef _loop():\n"
                                  "    x = [torch.randn(2, 4)]\n    x.append(x)\n"
                                  "    return x\n")}),
    Case("meta-batch", SCAN, 2, r"returned a tensor on the meta device at batch\[0\]",
         files={"model.py": model(batch="(torch.empty(2, 4, device='meta'),)")}),
    Case("unprintable-exception-in-build", SCAN, 2,
         r"Bad while calling build_model\(\): Bad \(its message cannot be shown",
         files={"model.py": model(build="raise Bad()", top="class Bad(Exception):\n"
                                  "    def __str__(self):\n        raise RuntimeError('no')\n")}),
    Case("build-returns-not-a-module", SCAN, 2, r"must return a torch\.nn\.Module, got int",
         files={"model.py": "def build_model():\n    return 3\n"}),
    Case("batch-is-a-string", SCAN, 2, "must return a Tensor, a tuple of Tensors or a dict",
         files={"model.py": model(batch="'text'")}),
    Case("weights-pickle-payload", (*SCAN, "--weights", "w.pt"), 2, r"weights_only=True",
         files={"model.py": CLEAN, "w.pt": _pickle_payload()}),
    Case("weights-garbage", (*SCAN, "--weights", "w.pt"), 2, "cannot load weights file",
         files={"model.py": CLEAN, "w.pt": b"not a checkpoint"}),
    Case("latin1-source-keeps-the-report", SCAN, 1, files={"model.py": LATIN1},
         check=_stdout_has("error[NH101]")),
    Case("crlf-source-keeps-the-report", SCAN, 1, files={"model.py": CRLF},
         check=_stdout_has("error[NH101]")),
    Case("lazy-sibling-import-in-build", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(build="import helper_c\nassert helper_c.SCALE == 1.0"),
                "helper_c.py": HELPER}),
    Case("model-replaces-sys-stdout", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(top="import sys\nsys.stdout = None\n")}, child=True,
         check=_valid_json),
    Case("model-closes-fd-1-and-2", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(top="import os\nos.close(1)\nos.close(2)\n")}, child=True,
         check=_valid_json),
    Case("background-process-left-running", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(top="import subprocess\n"
                                       "P = subprocess.Popen(['sleep', '60'], close_fds=False)\n"
                                       "open('sleeper.pid', 'w').write(str(P.pid))\n")},
         child=True, written=frozenset({"sleeper.pid"}), check=_sleeper_stopped),
    Case("model-closes-inherited-descriptors-below-256", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(top="import os\nos.closerange(3, 256)\n")}, child=True,
         check=_valid_json),
    Case("model-closes-every-inherited-descriptor", SCAN, 2,
         r"^nan-hunter: error: the model's code closed the descriptors of nan-hunter's result "
         r"pipe \(os.closerange\(\) or os.close\(\) on descriptors it did not open\)",
         files={"model.py": model(top="import os\nos.closerange(3, 1 << 16)\n")}, child=True),
    Case("model-already-half-gets-its-fp32-reference", SCAN, 1,
         files={"model.py": model(build="net = Net()\nnet.fc.weight.data.fill_(900.0)\n"
                                        "return net.half()",
                                  batch="torch.full((2, 4), 30.0)")},
         check=_stdout_has("a precision problem")),
    Case("new-session-helper-left-running", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(top="import subprocess\n"
                                       "P = subprocess.Popen(['sleep', '60'], "
                                       "start_new_session=True)\n"
                                       "open('sleeper.pid', 'w').write(str(P.pid))\n")},
         child=True, written=frozenset({"sleeper.pid"}), check=_sleeper_stopped),
    Case("daemonised-helper-left-running", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(top="import subprocess\n"
                                       "subprocess.run(['sh', '-c', 'setsid sleep 60 & "
                                       "echo $! > sleeper.pid'], check=True)\n")},
         child=True, written=frozenset({"sleeper.pid"}), check=_sleeper_stopped),
    Case("new-session-helper-stopped-by-timeout", (*SCAN, "--timeout", "3"), 2,
         r"did not finish within 3 s \(--timeout\) and was stopped",
         files={"model.py": model(top="import subprocess, time\n"
                                       "P = subprocess.Popen(['sleep', '60'], "
                                       "start_new_session=True)\n"
                                       "open('sleeper.pid', 'w').write(str(P.pid))\n",
                                  forward="time.sleep(60)")},
         child=True, written=frozenset({"sleeper.pid"}), check=_sleeper_gone),
    Case("infinite-recursion-in-forward", SCAN, 2,
         r"RecursionError while running the model's forward|RecursionError",
         files={"model.py": model(forward="return self.forward(x)")}),
    Case("memory-error-in-build", SCAN, 2, r"MemoryError while calling build_model\(\)",
         files={"model.py": model(build="raise MemoryError()")}),
    Case("batch-fn-missing", (*SCAN, "--batch-fn", "nope"), 2,
         r"model\.py defines no nope\(\); define it or name another function with --batch-fn",
         files={"model.py": CLEAN}),
    Case("model-fn-not-callable", (*SCAN, "--model-fn", "SIZE"), 2,
         r"SIZE in model\.py is a int, not a function",
         files={"model.py": CLEAN + "SIZE = 3\n"}),
    Case("unicode-and-spaces-in-names", ("scan", "my modèle ü.py", "-o", "rapport é.txt"), 0,
         files={"my modèle ü.py": CLEAN}, written=frozenset({"rapport é.txt"})),
    Case("report-to-dev-null", (*SCAN, "-o", "/dev/null"), 0, files={"model.py": CLEAN},
         check=_dev_null_intact),
    Case("report-through-symlink-updates-its-target", (*SCAN, "-o", "link.txt"), 0,
         files={"model.py": CLEAN, "reports/r.txt": "old"}, setup=_report_link,
         written=frozenset({"reports/r.txt"}), check=_link_kept),
    Case("weights-is-a-folder", (*SCAN, "--weights", "sub"), 2, "weights file sub is a folder",
         files={"model.py": CLEAN, "sub/x": "x"}),
    Case("lazy-sibling-import-in-forward", (*SCAN, "--format", "json"), 0,
         files={"model.py": model(forward="import helper_d\nx = x * helper_d.SCALE"),
                "helper_d.py": HELPER}),
    # --- never green on nothing: a scan that checks nothing is an error, not a clean pass ----
    Case("empty-select-in-pyproject-leaves-no-rule", SCAN, 2,
         r"pyproject\.toml \[tool\.nan-hunter\]: 'select' \[\] leaves no rule to run",
         files={"model.py": MATRIX, "pyproject.toml": TOOL + "select = []\n"}),
    Case("empty-select-in-config-leaves-no-rule", (*SCAN, "--config", "c.yaml"), 2,
         r"c\.yaml: 'select' \[\] leaves no rule to run",
         files={"model.py": MATRIX, "c.yaml": "select: []\n"}),
    Case("ignore-everything-in-project-yaml-leaves-no-rule", SCAN, 2,
         r"nan-hunter\.yaml: 'select' \[NH\] with 'ignore' \[NH\] leaves no rule to run",
         files={"model.py": MATRIX, "nan-hunter.yaml": "ignore: [NH]\n"}),
    Case("select-and-ignore-one-prefix-leaves-no-rule", (*SCAN, "--select", "NH1", "--ignore",
         "NH1"), 2, r"error: command line: 'select' \[NH1\] with 'ignore' \[NH1\] leaves no rule",
         files={"model.py": MATRIX}),
    Case("key-in-both-spellings-in-pyproject", SCAN, 2,
         r"pyproject\.toml \[tool\.nan-hunter\]: 'fail-on' and 'fail_on' are the same setting",
         files={"model.py": CLEAN,
                "pyproject.toml": TOOL + 'fail-on = "warning"\nfail_on = "error"\n'}),
    Case("other-key-in-both-spellings-in-pyproject", SCAN, 2,
         r"'max_warnings' and 'max-warnings' are the same setting; keep one$",
         files={"model.py": CLEAN,
                "pyproject.toml": TOOL + "max_warnings = 3\nmax-warnings = 9\n"}),
    Case("key-twice-in-pyproject-is-a-toml-error", SCAN, 2,
         r"pyproject\.toml is not valid TOML: Cannot overwrite a value \(at line 3",
         files={"model.py": CLEAN,
                "pyproject.toml": TOOL + 'fail-on = "warning"\nfail-on = "error"\n'}),
    Case("key-twice-in-project-yaml", SCAN, 2,
         r"nan-hunter\.yaml: key 'fail_on' is given twice \(lines 1 and 3\); keep one$",
         files={"model.py": CLEAN, "nan-hunter.yaml": "fail_on: warning\ndtype: float16\n"
                                                      "fail_on: error\n"}),
    Case("key-twice-in-config", (*SCAN, "--config", "c.yaml"), 2,
         r"c\.yaml: key 'select' is given twice \(lines 1 and 2\)",
         files={"model.py": MATRIX, "c.yaml": "select: [NH1]\nselect: [NH5]\n"}),
    Case("report-over-discovered-pyproject", (*SCAN, "-o", "pyproject.toml"), 2,
         r"refusing to write the report to .*pyproject\.toml: it is a settings file the scan read",
         files={"model.py": CLEAN, "pyproject.toml": TOOL + 'fail-on = "warning"\n'}),
    Case("report-over-pyproject-of-a-parent-folder", ("scan", "sub/model.py", "-o",
         "pyproject.toml"), 2, "it is a settings file the scan read",
         files={"sub/model.py": CLEAN, "pyproject.toml": TOOL + 'fail-on = "warning"\n'}),
    Case("patch-over-discovered-yaml", (*SCAN, "--patch", ".nan-hunter.yaml"), 2,
         r"refusing to write the patch to .*\.nan-hunter\.yaml: it is a settings file the scan",
         files={"model.py": MATRIX, ".nan-hunter.yaml": "fail_on: error\n"}),
    Case("suppression-in-a-cr-only-file", SCAN, 0, files={"model.py": CR_ONLY},
         check=_suppressed),
    Case("suppression-naming-an-unknown-code-says-so", SCAN, 1,
         files={"model.py": MISSPELLED_CODE}, check=_unknown_code_noted),
    Case("installed-library-comment-suppresses-nothing", SCAN, 1,
         files={"model.py": LIBRARY_USER, f"venv/site-packages/{LIBRARY}/__init__.py":
                LIBRARY_SOURCE}, setup=_installed_library, check=_library_finding_active),
    Case("custom-function-backward-is-named-at-its-backward", SCAN, 1,
         files={"model.py": CUSTOM_FUNCTION_BACKWARD}, child=True,
         check=_stdout_has("error[NH401] inf: the backward of the custom autograd.Function "
                           "Steep (its own backward)")),
    Case("model-raises-cancelled-error-in-forward", SCAN, 2,
         r"error: the model raised CancelledError during forward: stop",
         files={"model.py": model(top="import asyncio",
                                  forward="raise asyncio.CancelledError('stop')")}),
    Case("model-raises-cancelled-error-in-forward-child", SCAN, 2,
         r"error: the model raised CancelledError during forward: stop",
         files={"model.py": model(top="import asyncio",
                                  forward="raise asyncio.CancelledError('stop')")}, child=True),
    Case("model-raises-generator-exit-in-build", SCAN, 2,
         r"error: GeneratorExit while calling build_model\(\)",
         files={"model.py": model(build="raise GeneratorExit()")}),
    Case("model-raises-its-own-base-exception-at-import-child", SCAN, 2,
         r"error: Halt while importing model\.py: halt",
         files={"model.py": model(top="class Halt(BaseException):\n    pass\n\n\n"
                                      "raise Halt('halt')\n")}, child=True),
    Case("model-raises-cancelled-error-in-a-training-step", (*SCAN, "--steps", "2"), 2,
         r"error: CancelledError in training step 0: stop",
         files={"model.py": model(top="import asyncio",
                                  forward="raise asyncio.CancelledError('stop')")}),
    Case("steps-when-no-parameter-gets-a-gradient", (*SCAN, "--steps", "3"), 2,
         r"no trainable parameter that gets a gradient \(the loss of training step 0 reaches",
         files={"model.py": NO_GRADIENT_REACHED}),
    Case("steps-when-no-parameter-gets-a-gradient-unscaled",
         (*SCAN, "--steps", "3", "--grad-scale", "none"), 2,
         r"no trainable parameter that gets a gradient", files={"model.py": NO_GRADIENT_REACHED}),
    Case("steps-with-every-parameter-frozen", (*SCAN, "--steps", "3"), 2,
         r"no trainable parameter that gets a gradient \(no parameter requires grad\)$",
         files={"model.py": FROZEN}),
    Case("steps-on-a-model-without-parameters", (*SCAN, "--steps", "3"), 2,
         r"no trainable parameter that gets a gradient \(no parameter requires grad\)$",
         files={"model.py": WITHOUT_PARAMETERS}),
]
