"""The CLI runs the user's model in a separate process, so that the model cannot end, hang or
corrupt the run of the tool itself.

``run_isolated(func, arg)`` starts ``python`` on ``nan_hunter.process.worker``, hands it ``func``
and ``arg`` (pickled: ``func`` must be a module-level function) and returns ``func(arg)`` from
there, with the files the process imported. What the model prints (stdout and stderr) is captured:
it is forwarded to our stderr when the scan succeeds, and shown after the error line when it fails,
so it never mixes into a report on stdout. ``sys.exit``/``os._exit`` in the model's code, a crash
(segfault, abort), an out-of-memory kill or a run longer than ``timeout`` seconds become one
``IsolationError`` naming what was running (a stage such as ``calling build_model()``, or the
module whose forward had been entered).

The Python API (``nan_hunter.scan``) runs in the caller's process. ``NAN_HUNTER_IN_PROCESS=1``
runs the job in this process too: an internal switch for the test-suite, whose CLI tests are not
about isolation and would otherwise pay a torch import per test (``tests/hostile`` runs the real
process).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from nan_hunter.core.progress import listening
from nan_hunter.errors import NanHunterError
from nan_hunter.process.descendants import descendants, kill_all
from nan_hunter.process.worker import (
    NOTE_BYTES,
    PIPE_LOST,
    PIPE_LOST_STATUS,
    describe,
    read_notes,
)

IN_PROCESS_ENV = "NAN_HUNTER_IN_PROCESS"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
OUTPUT_LIMIT = 1 << 20
"""Bytes of the model's output kept (the last ones)."""
_FAILURE_OUTPUT_LINES = 40
_BOOT = (
    "import sys\n"
    "if sys.path and sys.path[0] in ('', '.'): del sys.path[0]\n"  # not the user's cwd first
    "try:\n"
    "    from nan_hunter.process.worker import main\n"
    "except ImportError:\n"  # nan-hunter run from a source folder, not installed
    "    sys.path.append(sys.argv[4])\n"
    "    from nan_hunter.process.worker import main\n"
    "main()\n"
)
_HOME = str(Path(__file__).resolve().parents[2])

T = TypeVar("T")
A = TypeVar("A")


class IsolationError(NanHunterError):
    """The scan process failed; ``output`` is what the model's code printed before."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class Isolated:
    value: Any
    imported: frozenset[str]
    """Real paths of every file the scan imported (model file, its package, libraries)."""


def in_process() -> bool:
    return os.environ.get(IN_PROCESS_ENV, "") == "1"


def run_isolated(
    func: Callable[[A], T],
    arg: A,
    *,
    timeout: float | None = None,
    debug: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> Isolated:
    """``func(arg)`` in a scan process (or in this one, see ``IN_PROCESS_ENV``). With ``debug``
    an internal error's traceback is shown. ``on_step`` hears what ``progress.announce`` says in
    the scan process (a few times a second at most)."""
    if in_process():
        with listening(on_step) if on_step is not None else contextlib.nullcontext():
            return _run_here(func, arg)
    return _Child(func, arg, sys.stderr, debug, on_step).run(timeout)


def _run_here(func: Callable[[A], T], arg: A) -> Isolated:
    from nan_hunter.process.worker import imported_files

    cwd = os.getcwd()
    try:
        value = func(arg)
    except SystemExit as exc:
        raise IsolationError(
            f"the model's code called sys.exit({exc.code!r}); nothing was scanned"
        ) from None
    finally:
        os.chdir(cwd)
    return Isolated(value, frozenset(imported_files()))


class _Child:
    def __init__(
        self,
        func: Callable[[Any], Any],
        arg: Any,
        out: Any,
        debug: bool,
        on_step: Callable[[str], None] | None,
    ) -> None:
        self.debug = debug
        self.on_step = on_step
        self.request = pickle.dumps((func, arg), protocol=pickle.HIGHEST_PROTOCOL)
        self.out = out
        self.output = bytearray()
        self.dropped = 0
        self.board = -1
        self.final: tuple[Any, ...] | None = None

    def run(self, timeout: float | None) -> Isolated:
        with tempfile.TemporaryFile(prefix="nan-hunter-note-") as board:
            os.ftruncate(board.fileno(), NOTE_BYTES)
            self.board = board.fileno()
            return self._run(timeout)

    @property
    def note(self) -> str:
        return describe(*read_notes(self.board))

    def _watch_steps(self, proc: subprocess.Popen[bytes]) -> None:
        shown = ""
        while proc.poll() is None:
            stage, _ = read_notes(self.board)
            if stage and stage != shown and self.on_step is not None:
                shown = stage
                with contextlib.suppress(Exception):  # a display problem never fails the scan
                    self.on_step(stage)
            time.sleep(0.2)

    def _run(self, timeout: float | None) -> Isolated:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.debug:
            env["NAN_HUNTER_DEBUG"] = "1"
        if INDUCTOR_CACHE_ENV in env:
            return self._run_with(env, timeout)
        # torch._dynamo makes its cache folder (TMPDIR/torchinductor_<user>) when imported,
        # as an optimizer's first use does: the scan process gets one of its own, removed after.
        cache = tempfile.mkdtemp(prefix="nan-hunter-inductor-")
        try:
            return self._run_with({**env, INDUCTOR_CACHE_ENV: cache}, timeout)
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    def _run_with(self, env: dict[str, str], timeout: float | None) -> Isolated:
        read_fd, write_fd = os.pipe()
        args = [str(write_fd), str(self.board), str(os.getpid()), _HOME]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd, self.board),
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(read_fd)
            raise NanHunterError(f"cannot start the scan process: {exc.strerror or exc}") from exc
        finally:
            os.close(write_fd)
        readers = [
            threading.Thread(target=self._read_output, args=(proc.stdout,), daemon=True),
            threading.Thread(target=self._read_results, args=(read_fd,), daemon=True),
        ]
        if self.on_step is not None:
            readers.append(threading.Thread(target=self._watch_steps, args=(proc,), daemon=True))
        for reader in readers:
            reader.start()
        try:
            try:
                assert proc.stdin is not None
                proc.stdin.write(self.request)
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it died at once; its exit status tells why
            import nan_hunter.findings  # noqa: F401 - the result's classes, while it works
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            for reader in readers:
                reader.join(timeout=2)
            raise IsolationError(
                f"the scan did not finish within {timeout:g} s (--timeout) and was stopped"
                f"{self._where()}",
                self._tail(),
            ) from None
        except BaseException:  # Ctrl-C: stop the scan process too
            _kill(proc)
            raise
        _kill_leftovers(proc)  # what the model started and left running (it holds our pipes)
        for reader in readers:
            reader.join(timeout=5)
        return self._outcome(proc.returncode)

    def _outcome(self, status: int) -> Isolated:
        final = self.final
        if final is not None and final[0] == "done":
            self._forward()
            return Isolated(final[1], frozenset(final[2]))
        if final is not None and final[0] == "error":
            raise IsolationError(final[1], self._tail())
        if final is not None and final[0] == "exit":
            code = final[1]
            where = f" while {final[2]}" if final[2] else ""
            raise IsolationError(
                f"the model's code called sys.exit({code!r}){where}; nothing was scanned",
                self._tail(),
            )
        if final is not None and final[0] == "interrupted":
            raise KeyboardInterrupt
        if final is not None and final[0] == "internal":
            if self.debug and final[2]:
                self.out.write(final[2])
            raise IsolationError(
                f"internal error: {final[1]} (use --debug for a traceback)", self._tail()
            )
        if status == PIPE_LOST_STATUS and read_notes(self.board)[0] == PIPE_LOST:
            raise IsolationError(
                f"{PIPE_LOST} (os.closerange() or os.close() on descriptors it did not open), "
                "so the scan's result could not be sent back; nothing was scanned. Close only "
                "the files the model opens",
                self._tail(),
            )
        if status < 0:
            raise IsolationError(f"{_signal_text(-status)}{self._where()}", self._tail())
        raise IsolationError(
            f"the scan process exited with status {status} before reporting (os._exit() in the "
            f"model's code?){self._where()}; nothing was scanned",
            self._tail(),
        )

    def _where(self) -> str:
        return f" while {self.note}" if self.note else ""

    def _read_output(self, stream: BinaryIO) -> None:
        while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
            self.output += chunk
            if len(self.output) > OUTPUT_LIMIT:
                extra = len(self.output) - OUTPUT_LIMIT
                del self.output[:extra]
                self.dropped += extra

    def _read_results(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as channel:
            while header := channel.read(8):
                if len(header) < 8:
                    return
                (size,) = struct.unpack("<Q", header)
                data = channel.read(size)
                if len(data) < size:
                    return
                try:
                    message = pickle.loads(data)
                except Exception as exc:
                    message = ("internal", f"cannot read the scan's result: {exc}", "")
                self.final = message

    def _text(self) -> str:
        return bytes(self.output).decode("utf-8", errors="replace")

    def _forward(self) -> None:
        text = self._text()
        if text:
            self.out.write(text if text.endswith("\n") else text + "\n")
            self.out.flush()

    def _tail(self) -> str:
        lines = self._text().splitlines()
        if not lines:
            return ""
        shown = lines[-_FAILURE_OUTPUT_LINES:]
        cut = len(lines) - len(shown)
        last = " (last lines)" if cut or self.dropped else ""
        head = f"nan-hunter: the model's output before the failure{last}:"
        return "\n".join([head, *shown]) + "\n"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Stop the scan process and whatever it started: its session, and the processes below
    it by parentage (a helper the model started in a session of its own)."""
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    kill_all(below)
    proc.wait()


def _kill_leftovers(proc: subprocess.Popen[bytes]) -> None:
    """Processes the model started in the scan process's session and left behind. The session's
    id cannot be reused while any of them lives, so this reaches nothing else."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _signal_text(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number == signal.SIGSEGV:
        return f"the scan process crashed ({name}: a segmentation fault, in native code)"
    if number == signal.SIGKILL:
        return f"the scan process was killed ({name}: out of memory, or killed from outside)"
    if number == signal.SIGABRT:
        return f"the scan process aborted ({name}, in native code)"
    return f"the scan process was ended by {name}"
