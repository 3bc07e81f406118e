"""What ``nan-hunter run`` runs in the script's own process: the script as ``__main__``, with
a ``ScriptWatch`` attached, then the exit code.

The command line (``run_command``, torch-free) starts ``python -c _BOOT <home> <job>
<script args>``; ``main`` decodes the ``RunJob``, gives the script the ``sys.argv`` and
``sys.path[0]`` that ``python train.py ...`` (or ``python -m pkg.train ...``) would, and runs
it. On a problem step the report goes to stderr (and to ``--output``/``--patch``), one line
says where, then ``--on-problem`` applies. The exit code is the script's own when nothing was
found, 1 when a problem was, 0 after ``--max-steps`` clean steps, 2 when a hook of nan-hunter's
failed (``training.hook_failures``: one line says so, the script is stopped). The script's
exceptions and Ctrl-C end it as they would without nan-hunter: the traceback (nan-hunter's own
frames left out), exit code 1, or death by SIGINT.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nan_hunter.core.untrusted import echoed

if TYPE_CHECKING:
    from types import TracebackType

    from nan_hunter.core.spikes import SpikeRule
    from nan_hunter.findings import Report, ReproBundle
    from nan_hunter.project.config import Settings
    from nan_hunter.training.attach import RunEvent, ScriptWatch
    from nan_hunter.training.clipping import WatchWarning
    from nan_hunter.training.hook_failures import WatchFailed

EXIT_PROBLEM = 1
ON_PROBLEM_CHOICES = ("stop", "continue", "raise")
_HOME = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class RunJob:
    """What the command line asked for: the script (a path or a module name) and its
    arguments, the scan settings for the re-run, and what to do on a problem."""

    script: str | None
    module: str | None
    argv: tuple[str, ...]
    settings: Settings
    on_problem: str = "stop"
    max_steps: int | None = None
    output_format: str = "text"
    output: str | None = None
    patch: str | None = None
    quiet: bool = False
    color: bool = False
    width: int = 100
    precision_given: frozenset[str] = field(default_factory=frozenset)
    protected: tuple[tuple[str, str], ...] = ()
    """Real path -> what it is, of the files the command line knows ``run`` reads (the script,
    the settings files): never written over (``safe_write.refuse_overwrite``)."""
    status_file: str | None = None
    """Where the script's process tells the command line what it reported (``problem``,
    ``refused``), so that the exit code holds whatever the script's exit path
    (``os._exit``, a signal, a thread)."""
    repro: bool = True
    """Save the problem step's reproduction bundle (``training.repro``)."""
    repro_folder: str | None = None
    """``--save-repro DIR`` (absolute); None: a new folder in the working directory."""
    repro_max_mb: float = 512
    spikes: SpikeRule | None = None
    """The loss spike rule; None: off."""
    spikes_are_problems: bool = False
    forecast_every: int = 50
    """Optimizer steps between two samples of the range map for the forecast; 0: off."""
    stop_before_overflow: bool = False

    def encode(self) -> str:
        return base64.b64encode(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)).decode()

    @staticmethod
    def decode(text: str) -> RunJob:
        job = pickle.loads(base64.b64decode(text))
        assert isinstance(job, RunJob)
        return job


BOOT = (
    "import sys\n"
    "home = sys.argv[1]\n"
    "if sys.path and sys.path[0] in ('', '.'): del sys.path[0]\n"
    "try:\n"
    "    from nan_hunter.process.script_process import main\n"
    "except ImportError:\n"  # nan-hunter run from a source folder, not installed
    "    sys.path.append(home)\n"
    "    from nan_hunter.process.script_process import main\n"
    "main()\n"
)


def main() -> None:
    """The entry of ``python -c BOOT <home> <job> <script args...>``."""
    job = RunJob.decode(sys.argv[2])
    code = run(job, sys.argv[3:])
    sys.stdout.flush()
    sys.exit(code)


def run(job: RunJob, args: list[str]) -> int:
    import runpy
    import signal

    from nan_hunter.training.attach import ScriptWatch, StopRun
    from nan_hunter.training.forecast import ForecastRule
    from nan_hunter.training.hook_failures import EXIT_INTERNAL

    if job.script is not None:
        script = os.path.abspath(job.script)
        sys.argv = [job.script, *args]
        # a folder with __main__.py runs as `python folder` runs it: the folder first on the path
        folder = script if os.path.isdir(script) else os.path.dirname(os.path.realpath(script))
        sys.path.insert(0, folder)
    else:
        sys.argv = ["-m", *args]  # runpy puts the module's file in argv[0]
        sys.path.insert(0, os.getcwd())
    state = _State(job)
    watch = ScriptWatch(
        job.settings, state.on_problem, max_steps=job.max_steps,
        precision_given=job.precision_given, on_warning=state.on_warning,
        keep_repro=job.repro, spikes=job.spikes, spikes_are_problems=job.spikes_are_problems,
        forecast=ForecastRule(job.forecast_every, job.stop_before_overflow),
    )
    state.watch = watch
    os.register_at_fork(after_in_child=state.forked)
    _quiet_stops_in_threads(StopRun)
    code: int
    interrupted: KeyboardInterrupt | None = None
    state.files.install()
    try:
        with watch:
            if job.script is not None:
                runpy.run_path(script, run_name="__main__")
            else:
                assert job.module is not None
                runpy.run_module(job.module, run_name="__main__", alter_sys=True)
        code = 0
    except StopRun as exc:
        code = int(exc.code or 0)
        state.ended_by = "max_steps" if code == 0 else "stop"
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt as exc:
        interrupted = exc
        code = 130
    except BaseException as exc:  # the script's own exception: shown as Python shows it
        _show(exc)
        code = 1
    if state.child:  # a process the script forked: only the one that started the run reports
        return code
    if interrupted is not None:
        _show(interrupted)
    if watch.failure is not None:  # a bug of ours, whatever the script made of it
        state.failed(watch.failure)
        code = EXIT_INTERNAL
    state.summary(code)
    state.clean_files(code)
    state.files.close()
    if interrupted is not None:  # die of SIGINT, as Python does after a KeyboardInterrupt
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    if watch.problems and state.ended_by != "max_steps":
        return EXIT_PROBLEM
    return code


def _exit_code(code: Any) -> int:
    """What ``sys.exit(code)`` makes the process exit with (a text goes to stderr, exit 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _ours(filename: str) -> bool:
    import runpy

    return (
        filename.startswith(_HOME + os.sep)
        or filename in (runpy.__file__, "<frozen runpy>")
        or filename == "<string>"
    )


def _strip(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without nan-hunter's frames (and runpy's, and the boot's)."""
    from types import TracebackType

    kept = []
    while tb is not None:
        if not _ours(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    new: TracebackType | None = None
    for t in reversed(kept):
        new = TracebackType(new, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return new


def _quiet_stops_in_threads(stop: type[BaseException]) -> None:
    """A stop raised in a thread of the script ends that thread without a word (threading
    prints a ``SystemExit`` subclass), as it ends the main thread; another exception in a
    thread is printed as Python prints it, nan-hunter's frames left out."""
    import threading

    previous = threading.excepthook

    def excepthook(args: Any) -> None:
        if isinstance(args.exc_value, stop):
            return  # the summary line says the script was stopped
        stripped = _strip(args.exc_traceback)
        if args.exc_value is not None:
            args.exc_value.__traceback__ = stripped
        previous(type(args)((args.exc_type, args.exc_value, stripped, args.thread)))

    threading.excepthook = excepthook


def _show(exc: BaseException) -> None:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        item.__traceback__ = _strip(item.__traceback__)
        todo += [item.__cause__, item.__context__]
    sys.stdout.flush()
    sys.excepthook(type(exc), exc, exc.__traceback__)


class _State:
    """The run's text on stderr and the files asked for."""

    def __init__(self, job: RunJob) -> None:
        from nan_hunter.training.script_files import ScriptFiles

        self.job = job
        self.watch: ScriptWatch | None = None
        self.ended_by = ""
        self.first: RunEvent | None = None
        self.started = time.perf_counter()
        self.started_at = time.time()
        self.files = ScriptFiles([p for p in (job.output, job.patch) if p is not None])
        self.written: list[tuple[str, str]] = []
        """(path, what) of the files written: checked at the end for the script's writes."""
        self.child = False

    def forked(self) -> None:
        """In a process the script forked: the watch detached, nothing reported from it."""
        self.child = True
        self.files.close()
        if self.watch is not None:
            self.watch.close()

    def tell(self, what: str) -> None:
        """One word to the command line's process (``RunJob.status_file``)."""
        if self.job.status_file is None or self.child:
            return
        try:
            fd = os.open(self.job.status_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, f"{what}\n".encode())
            finally:
                os.close(fd)
        except OSError:
            pass

    def say(self, line: str) -> None:
        """One line on stderr; what the script named (its file, its model's class and modules)
        shown escaped (``nan_hunter.core.untrusted``): it cannot start a line of its own."""
        sys.stdout.flush()
        print(f"nan-hunter: {_rank()}{echoed(line)}", file=sys.stderr, flush=True)

    def on_warning(self, warning: WatchWarning) -> None:
        message = warning.message
        if warning.where:
            message = message.replace(warning.where, _shown_where(warning.where))
        fix = "; fix: " + "; ".join(warning.fix.splitlines()) if warning.fix else ""
        self.say(f"warning: training step {warning.step}: {message}{fix}")

    def on_problem(self, event: RunEvent) -> None:
        from nan_hunter.training.events import TrainingProblem, WatchEvent

        job = self.job
        if self.child:
            return
        self.tell("problem")  # before anything the script could cut short
        if event.report is not None:
            event = dataclasses.replace(
                event, report=edited_since(event.report, self.started_at)
            )
        if self.first is None:
            self.first = event
        bundle = self._save_repro(event)
        if bundle is not None and event.report is not None and event.report.training is not None:
            training = dataclasses.replace(event.report.training, repro=bundle)
            event = dataclasses.replace(
                event, report=dataclasses.replace(event.report, training=training))
        where = self._write(event)
        self.say(problem_line(event, where))
        if bundle is not None:
            self.say(repro_line(bundle))
        if job.patch is not None and event.report is not None:
            self._write_patch(event.report)
        if job.on_problem == "stop":
            assert self.watch is not None
            self.watch.stop(EXIT_PROBLEM)
        if job.on_problem == "raise":
            raise TrainingProblem(WatchEvent(
                step=event.step, reason=event.reason, report=event.report,
                detail=event.detail, scale=event.scale, pre_step=True,
            ))

    def _save_repro(self, event: RunEvent) -> ReproBundle | None:
        """The step's reproduction bundle (``training.repro``), written before the update; what
        it is, or None when none was asked for or the step was not re-run."""
        from nan_hunter.errors import NanHunterError
        from nan_hunter.findings import ReproBundle
        from nan_hunter.training.repro import write_bundle

        job = self.job
        if not job.repro or event.repro is None:
            return None
        folder = Path(job.repro_folder) if job.repro_folder is not None else None
        try:
            return write_bundle(event.repro, folder, job.repro_max_mb, Path.cwd())
        except NanHunterError as exc:
            return ReproBundle(job.repro_folder or "", 0, written=False, note=str(exc))
        except Exception as exc:  # a model whose state cannot be read: the run goes on
            return ReproBundle(job.repro_folder or "", 0, written=False,
                               note=f"{type(exc).__name__}: {exc}")

    def _write(self, event: RunEvent) -> str:
        """The text report on stderr (``--format`` there without ``--output``), the report in
        ``--format`` into ``--output``; where it went."""
        from nan_hunter.report import render

        job = self.job
        report = event.report
        if report is None:
            return ""
        where = "on stderr"
        if job.output is not None and self._file(
            job.output, render(report, job.output_format), "report"
        ):
            where = job.output
        fmt = "text" if job.output is not None else job.output_format
        text = render(report, fmt, color=job.color and fmt == "text", width=job.width)
        sys.stdout.flush()
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
        return where

    def _write_patch(self, report: Any) -> None:
        from nan_hunter.fixes.edits import render_patch
        from nan_hunter.fixes.select import select_fixes
        from nan_hunter.project.paths import shared_root

        assert self.job.patch is not None
        selection = select_fixes(report, unsafe=False)
        if not selection.edits:
            self.say("no patch to write: no finding has a fix to apply")
            return
        root = shared_root([Path(report.target.file), *(Path(e.file) for e in selection.edits)])
        if self._file(self.job.patch, render_patch(selection.edits, root), "patch"):
            self.say(f"patch written to {self.job.patch}")

    def _file(self, path: str, text: str, what: str) -> bool:
        """Write ``text`` (the ``what``: report or patch) into ``path`` unless the script
        imported, read or wrote that file (``ScriptFiles``), or it is one the command line
        protects: then one error line, the exit code 2 when nothing else is 1."""
        from nan_hunter.core.safe_write import refuse_overwrite, write_file
        from nan_hunter.errors import NanHunterError

        try:
            protected = dict(self.job.protected)
            done = self.files.what_the_script_did(path)
            if done is not None:
                protected[os.path.realpath(path)] = done
            refuse_overwrite(*((path, None) if what == "report" else (None, path)), protected)
            self.files.writing(path, True)
            try:
                write_file(Path(path), text)
            finally:
                self.files.writing(path, False)
        except NanHunterError as exc:
            self.say(f"error: {exc}" + ("; the report is on stderr" if what == "report" else ""))
            self.tell("refused")
            return False
        self.written.append((path, what))
        return True

    def check_written(self) -> None:
        """Say it when the script wrote over a file of ours after we wrote it."""
        for path, what in self.written:
            if self.files.overwritten_since(path):
                self.say(f"warning: the script wrote over the {what} at {path} after "
                         "nan-hunter wrote it; the file no longer holds it")
                self.tell("refused")

    def failed(self, failure: WatchFailed) -> None:
        self.ended_by = "internal error"
        self.say(failure.line())
        if os.environ.get("NAN_HUNTER_DEBUG"):
            import traceback

            traceback.print_exception(failure.error.original, file=sys.stderr)

    def summary(self, code: int) -> None:
        watch = self.watch
        if watch is None or (self.job.quiet and not watch.problems):
            return
        replaced = watch.torch_replaced()
        if replaced:  # our checks never called them: say it, the script's own checks did
            self.say(f"warning: the script replaced {', '.join(replaced)}; nan-hunter's checks "
                     "used torch's own functions, not the replacements")
        self.say(self.summary_line(code))

    def summary_line(self, code: int) -> str:
        """The run in one line: the steps checked, the problems, how the script ended."""
        watch = self.watch
        assert watch is not None
        steps = watch.steps
        if self.ended_by == "internal error":
            return (f"{steps} optimizer step{'s' * (steps != 1)} checked before nan-hunter "
                    "failed; later steps were not checked")
        if not watch.optimizers_seen and not steps:
            if not watch.losses_checked:
                return (
                    "no optimizer step and no backward were seen: nothing was checked (the "
                    "script never called optimizer.step() on a torch optimizer nor backward())"
                )
            n = watch.losses_checked
            line = (
                f"no torch optimizer was seen: the loss of {n} backward pass{'es' * (n != 1)} "
                "checked, the gradients and the weight updates were not watched"
            )
        else:
            line = f"{steps} optimizer step{'s' * (steps != 1)} checked"
        if watch.problems:
            first = self.first
            at = f" (the first at step {first.step})" if first is not None else ""
            line += f", {watch.problems} problem step{'s' * (watch.problems != 1)}{at}"
        else:
            line += ", no problem"
        trends = watch.forecast.trends()
        if trends:
            line += f"; forecast: {trends[0].line()}"
            if len(trends) > 1:
                line += f" (and {len(trends) - 1} more module{'s' * (len(trends) > 2)})"
        spikes = watch.spikes_seen
        if len(spikes) > 1:
            line += (f", {len(spikes)} loss spikes (steps {spikes[0]} to {spikes[-1]}; the first "
                     "was said)")
        if self.ended_by == "max_steps":
            line += f"; --max-steps {self.job.max_steps} reached"
        elif self.ended_by == "stop":
            line += "; the script was stopped (--on-problem stop)"
        else:
            line += f"; the script exited with code {code}"
        return line

    def clean_files(self, code: int) -> None:
        """No problem step: ``--output`` still gets a report (no findings, the steps checked),
        as ``scan`` writes a clean one; ``--patch`` gets nothing, as with ``scan``. Under
        torchrun rank 0 writes it (every rank checked the same steps)."""
        from nan_hunter.report import render

        watch, job = self.watch, self.job
        if watch is None or watch.problems or os.environ.get("RANK", "0") != "0":
            self.check_written()
            return
        if watch.failure is not None:  # not clean: what came after the failure was not checked
            if job.output is not None and not job.quiet:
                self.say(f"no report written to {job.output}: the run was not checked to its end")
            return
        if job.output is not None and self._file(
            job.output, render(self.clean_report(code), job.output_format), "report"
        ) and not job.quiet:
            self.say(f"report written to {job.output}")
        if job.patch is not None and not job.quiet:
            self.say("no patch to write: no finding has a fix to apply")

    def clean_report(self, code: int) -> Report:
        """The report of a run without a problem step: no findings, nothing re-run."""
        from nan_hunter.findings import Report, ScanTarget, TrainingSteps

        watch, job = self.watch, self.job
        assert watch is not None
        settings = job.settings
        target = ScanTarget(
            file=_script_file(job), mode=settings.mode, dtype=settings.dtype,
            device=settings.device, policy=settings.policy,
            notes=(self.summary_line(code), "no step was re-run: none was a problem"),
        )
        return Report(
            target=target, findings=(), ops=0, backward_nodes=0, propagated=0,
            seconds=time.perf_counter() - self.started,
            training=TrainingSteps(watch.steps, losses_checked=watch.losses_only,
                                   **watch.forecast_fields()),
        )


def edited_since(report: Report, since: float) -> Report:
    """``report`` with each finding whose file (its line, its call site, its fix's files) was
    changed after ``since`` (the run's start, by the file's time) said to be so and without its
    fix: the traced line numbers are the imported code's, the text read now may be another
    statement's, and a patch would wrap it."""
    findings = []
    changed_any: set[str] = set()
    for finding in report.findings:
        files = {loc.file for loc in (finding.location, finding.call_site) if loc is not None}
        if finding.fix is not None:
            files.update(e.file for e in finding.fix.edits)
        changed = sorted(f for f in files if _modified_after(f, since))
        if changed:
            changed_any.update(changed)
            note = (
                f"{', '.join(_shown_path(f) for f in changed)} changed after the run started: "
                "the line shown is read from the file as it is now and may hold another "
                "statement; no fix is offered (run again on the current code)"
            )
            finding = dataclasses.replace(finding, fix=None, notes=(*finding.notes, note))
        findings.append(finding)
    if not changed_any:
        return report
    return dataclasses.replace(report, findings=tuple(findings))


def _modified_after(file: str, since: float) -> bool:
    try:
        return os.stat(file).st_mtime > since
    except OSError:
        return False


def _script_file(job: RunJob) -> str:
    """The script's file (with ``-m``, the module's, when it can be found)."""
    if job.script is not None:
        script = os.path.abspath(job.script)
        return os.path.join(script, "__main__.py") if os.path.isdir(script) else script
    import importlib.util

    assert job.module is not None
    try:
        spec = importlib.util.find_spec(job.module)
    except (ImportError, ValueError):
        spec = None
    return spec.origin if spec is not None and spec.origin else job.module


def problem_line(event: RunEvent, where: str) -> str:
    """One line: the step, what broke, where, the verdict on its cause with its first piece of
    evidence (for *not reproducible*, what the re-run could not restore too), and where the
    report went."""
    from nan_hunter.findings import StepVerdict

    line = f"training step {event.step}: {event.detail}"
    report = event.report
    if report is None:
        return line + f"; not re-run: {event.why_not}"
    training = report.training
    verdict = training.verdict if training is not None else None
    shown = training.evidence if training is not None else ()
    if verdict is not StepVerdict.NOT_REPRODUCIBLE:
        shown = shown[:1]
    else:  # what it could not restore, not the closing list of possible causes
        shown = tuple(e for e in shown if not e.startswith("a transient fault"))
    said = f"{verdict.label}: {'; '.join(shown)}" if verdict is not None else ""
    errors = [f for f in report.active if f.severity.value == "error"]
    first = errors[0] if errors else None
    if first is None:
        if event.reason.value == "loss_spike" and not said:
            found = f"{len(report.active)} warning{'s' * (len(report.active) != 1)}" if (
                report.active) else "nothing"
            return line + (f"; the re-run of {event.model} finds no error ({found}): no FP16 "
                           f"overflow in its forward explains the spike (report {where})")
        return line + f"; {said or f'the re-run of {event.model} finds no error'} (report {where})"
    at = f" at {_shown_path(first.location.file)}:{first.location.line}" if first.location else ""
    module = f" in {event.model}" + (f".{first.module}" if first.module not in ("", "(root)")
                                     else "")
    verdict_part = f"; {verdict.label}" if verdict is not None else ""
    return line + f"; {first.code} {first.op or 'input'}{module}{at}{verdict_part} (report {where})"


def repro_line(bundle: ReproBundle) -> str:
    """One line: where the reproduction bundle went and how to re-run it, or why it did not."""
    from nan_hunter.training.repro import megabytes

    if not bundle.written:
        return f"no reproduction saved: {bundle.note}"
    folder = _shown_path(bundle.path)
    line = (f"reproduction saved to {folder} ({megabytes(bundle.size_bytes)}): "
            f"nan-hunter scan {os.path.join(folder, 'model.py')}")
    return line + (f"; {bundle.note}" if bundle.note else "")


def _shown_path(file: str) -> str:
    """A file below the working directory as a relative path, any other as it is."""
    try:
        return os.path.relpath(file) if Path(file).resolve().is_relative_to(Path.cwd()) else file
    except (OSError, ValueError):
        return file


def _shown_where(where: str) -> str:
    file, _, line = where.rpartition(":")
    return f"{_shown_path(file)}:{line}" if file else where


def _rank() -> str:
    """``rank N: `` under torchrun (its environment), else nothing."""
    try:
        several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        several = False
    return f"rank {os.environ.get('RANK', '?')}: " if several else ""
