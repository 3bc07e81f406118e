"""Independent fixes verified together (nan_hunter.fixes.grouping): one re-scan per group, the same
verdicts as one at a time, a split that isolates a bad fix, dependent fixes never combined."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import nan_hunter.api as api
from nan_hunter.core.location import SourceLocation
from nan_hunter.findings import Applicability, Edit, Finding, Fix, Kind, Phase, Report, Severity
from nan_hunter.fixes import verify as verify_module
from nan_hunter.fixes.dataflow import CodeRange, Dataflow, probe_dataflow
from nan_hunter.fixes.grouping import PendingFix, groups, independent, worth_probing
from nan_hunter.fixes.source_file import read_source
from tests.conftest import FIXTURES, GOLDEN, marker_line, scanned

BATCH = FIXTURES / "batch"
GUARDED = BATCH / "four_heads_guarded.py"
COUPLED = BATCH / "four_heads.py"


def _origins(path: Path) -> list[tuple[str, str, str, int]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_origins_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(c, op, m, marker_line(path, mark)) for c, op, m, mark in module.EXPECTED_ORIGINS]


Tamper = Callable[[Report], Report]


def _count_rescans(
    monkeypatch: pytest.MonkeyPatch, *, batched: bool = True, tamper: Tamper | None = None
) -> list[Path]:
    """The entry files of the re-scans ``api``'s verification runs, appended as they run;
    ``batched=False``: one at a time (no data-flow probe); ``tamper`` edits the report first."""
    calls: list[Path] = []
    real = verify_module.verify_fixes

    def counting(report: Report, rescan: Any, entry: Path, probe: Any = None) -> Report:
        def counted(shadow_entry: Path) -> Report:
            calls.append(shadow_entry)
            return rescan(shadow_entry)

        if tamper is not None:
            report = tamper(report)
        return real(report, counted, entry, probe if batched else None)

    monkeypatch.setattr(api, "verify_fixes", counting)
    return calls


def _verified_scan(
    path: Path, monkeypatch: pytest.MonkeyPatch, *, batched: bool, tamper: Tamper | None = None
) -> tuple[Report, list[Path]]:
    """``scan_file(path)`` with verification, the re-scans it ran counted (calls of the rescan
    callable); ``batched=False``: one at a time (no data-flow probe)."""
    calls = _count_rescans(monkeypatch, batched=batched, tamper=tamper)
    return api.scan_file(str(path)), calls


def _verdicts(report: Report) -> dict[str, tuple[bool | None, tuple[str, ...]]]:
    """Per module: verified, and what the re-scan held against the fix. Errors that were there
    before are left out: a fix verified alone still lists the other findings' errors, one
    verified with them does not (they are fixed in its re-scan)."""
    out = {}
    for f in report.findings:
        assert f.fix is not None
        remaining = tuple(
            r for r in f.fix.remaining
            if not r.startswith("re-scanned together") and not r.endswith("(was there before)")
        )
        out[f.module] = (f.fix.verified, remaining)
    return out


def test_the_fixtures_have_four_origins_in_different_modules() -> None:
    for path in (GUARDED, COUPLED):
        report = api.scan_file(str(path), verify=False)
        errors = [(f.code, f.op, f.module, f.location.line if f.location else 0)
                  for f in report.findings if f.is_error]
        assert errors == _origins(path)
        assert all(f.fix is not None and f.fix.edits for f in report.findings)


def test_four_independent_fixes_one_rescan_same_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """(a) and (b): the guarded model's four fixes verify together in one re-scan, with the
    verdicts (and what remains) of one-at-a-time verification, which takes four."""
    batched, batched_calls = _verified_scan(GUARDED, monkeypatch, batched=True)
    alone, alone_calls = _verified_scan(GUARDED, monkeypatch, batched=False)
    assert len(batched_calls) == 1
    assert len(alone_calls) == 4
    assert _verdicts(batched) == _verdicts(alone)
    assert all(verified for verified, _ in _verdicts(batched).values())
    for f in batched.findings:  # each fix says what it was re-scanned with
        assert f.fix is not None
        others = sorted(g.module for g in batched.findings if g is not f)
        assert f.fix.remaining[-1] == (
            f"re-scanned together with the independent fixes for {', '.join(others)}"
        )


def _bad_edit(report: Report, module: str, kind: str) -> Report:
    """The report with ``module``'s fix replaced by a bad one: ``noop`` rewrites the culprit
    line as it is (the op still fails), ``loss`` multiplies the op's result by 1e4 in FP32
    (no error left, but the model computes something else)."""
    findings = []
    for f in report.findings:
        if f.module == module:
            assert f.fix is not None and f.location is not None
            text = read_source(Path(f.location.file)).text
            lines = text.splitlines(keepends=True)
            start = sum(len(x) for x in lines[: f.location.line - 1])
            old = lines[f.location.line - 1]
            new = old
            if kind == "loss":
                indent = old[: len(old) - len(old.lstrip())]
                new = f"{indent}y = (h.float() + h.float()) * 1e4\n"
            edit = Edit(f.location.file, start, start + len(old), new)
            f = replace(f, fix=replace(f.fix, edits=(edit,), alternatives=()))
        findings.append(f)
    return replace(report, findings=tuple(findings))


@pytest.mark.parametrize(("kind", "rescans"), [("noop", 3), ("loss", 5)])
def test_a_bad_fix_is_split_out(kind: str, rescans: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """(c): one bad fix of four fails the group's re-scan; exactly the bad fix is not verified,
    with the verdict and reason one-at-a-time gives.

    ``noop``: its own op still fails, a failure that is its own (no other fix's values reach
    that op): it is re-scanned alone and the other three together again (3 re-scans).
    ``loss``: the loss changed, which no one fix can be blamed for: the group is halved,
    {0, 1} verified, {2, 3} fails again, then 2 and 3 one at a time (5 re-scans)."""
    bad = "heads.2.body"  # Doubler: ``y = h + h``

    def tamper(report: Report) -> Report:
        return _bad_edit(report, bad, kind)

    batched, calls = _verified_scan(GUARDED, monkeypatch, batched=True, tamper=tamper)
    alone, _ = _verified_scan(GUARDED, monkeypatch, batched=False, tamper=tamper)
    verdicts = _verdicts(batched)
    assert {m for m, (ok, _) in verdicts.items() if not ok} == {bad}
    assert verdicts == _verdicts(alone)
    assert len(calls) == rescans
    bad_fix = next(f.fix for f in batched.findings if f.module == bad)
    assert bad_fix is not None
    assert not any(r.startswith("re-scanned together") for r in bad_fix.remaining)  # alone
    reason = verdicts[bad][1]
    if kind == "noop":
        assert any("the fixed op still fails" in r for r in reason), reason
    else:
        assert any(r.startswith("the loss changed") for r in reason), reason


def test_coupled_errors_verify_only_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where one at a time cannot verify anything: each head's error reaches the loss, so a
    re-scan with one fix still has a non-finite loss from the other three. The group's one
    re-scan has all four fixed, each op gone, no new error and the FP32 loss: all verified.
    Everything else one-at-a-time found agrees (no error left at the fixed ops, nothing new).
    One at a time, each head's fix fails, and so do the next steps of the search, the region
    with FP32 regions for the ops taking its result, then its whole forward in FP32: three
    re-scans per head, and one more for the two elementwise heads (``x * x``, ``h + h``),
    whose first candidate is their operands upcast with no region."""
    batched, calls = _verified_scan(COUPLED, monkeypatch, batched=True)
    alone, alone_calls = _verified_scan(COUPLED, monkeypatch, batched=False)
    assert (len(calls), len(alone_calls)) == (1, 14)
    assert all(ok for ok, _ in _verdicts(batched).values())
    for ok, remaining in _verdicts(alone).values():
        assert (ok, remaining) == (False, ("the loss is not finite after the fix",))


# --- which fixes are combined ------------------------------------------------------------------

SOURCE = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class A(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = 2.0  # <- init

        def forward(self, x):
            y = x * self.scale  # <- a
            return y + 1


    class B(nn.Module):
        def forward(self, x):
            z = x.exp()  # <- b
            return z


    class Side(nn.Module):
        def forward(self, x):
            s = x.sin()  # <- side
            return s


    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.side = A(), B(), Side()

        def forward(self, x):
            h = torch.empty_like(x)
            h.copy_(self.a(x))  # an in-place write carries A's label into h
            view = h[:, :2]
            return self.b(view).sum() + self.side(x).sum()
    """
)


def _module(tmp_path: Path) -> tuple[Any, Path]:
    import importlib.util

    path = tmp_path / "chain.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("_chain_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def _line_range(path: Path, marker: str, edited: bool = True) -> CodeRange:
    line = marker_line(path, marker)
    return CodeRange(str(path.resolve()), line, line, edited)


def test_probe_sees_data_flow_through_in_place_writes_and_views(tmp_path: Path) -> None:
    module, path = _module(tmp_path)
    model = module.Chain()
    pieces = {
        "a": [_line_range(path, "# <- a")],
        "b": [_line_range(path, "# <- b")],
        "side": [_line_range(path, "# <- side")],
        "init": [_line_range(path, "# <- init")],
    }
    with torch.no_grad():
        flow = probe_dataflow(lambda: model(torch.randn(3, 4)), pieces)
    assert flow.depends["b"] == {"a"}  # b's op reads what a's line computed
    assert flow.depends["a"] == frozenset() and flow.depends["side"] == frozenset()
    assert not flow.independent("a", "b")
    assert flow.independent("a", "side") and flow.independent("b", "side")
    assert flow.unconfined == {"init"}  # no op of the forward ran on the edited __init__ line
    assert not flow.independent("init", "side")


def test_probe_on_the_four_heads_finds_them_independent() -> None:
    """Each head runs after the one before it, but none reads another's values."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_four_heads_probe", COUPLED)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, batch = module.build_model(), module.sample_batch()
    pieces = {m: [CodeRange(str(COUPLED), line, line)] for _, _, m, line in _origins(COUPLED)}
    with torch.no_grad():
        flow = probe_dataflow(lambda: model(batch), pieces)
    assert flow.unconfined == frozenset()
    assert all(deps == frozenset() for deps in flow.depends.values())


def _candidate(
    path: Path, module: str, line: int, *, phase: Phase = Phase.FORWARD, span: int = 1
) -> PendingFix:
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    start = sum(len(x) for x in lines[: line - 1])
    end = start + sum(len(x) for x in lines[line - 1 : line - 1 + span])
    edit = Edit(str(path), start, end, "".join(lines[line - 1 : line - 1 + span]) + "# fixed\n")
    finding = Finding(
        code="NH109", severity=Severity.ERROR, kind=Kind.OVERFLOW, phase=phase, op="op",
        module=module, location=SourceLocation(str(path), line, ""), origin=True, message="",
    )
    fix = Fix(title="t", applicability=Applicability.SAFE, edits=(edit,))
    return PendingFix((module, line), finding, fix)


def test_dependent_fixes_are_not_combined(tmp_path: Path) -> None:
    """(d): each of the conditions in nan_hunter.fixes.grouping keeps two fixes apart."""
    path = tmp_path / "lines.py"
    path.write_text("".join(f"x{i} = {i}\n" for i in range(1, 41)))
    free = Dataflow({}, frozenset())

    def together(a: PendingFix, b: PendingFix, flow: Dataflow = free) -> bool:
        grouped = groups([a, b], flow)
        assert independent(a, b, flow) is (len(grouped) == 1)
        return len(grouped) == 1

    base = _candidate(path, "heads.0", 5)
    assert together(base, _candidate(path, "heads.1", 20))  # the control: combined
    assert not together(base, _candidate(path, "heads.0", 20))  # same module
    assert not together(base, _candidate(path, "heads.0.body", 20))  # one inside the other
    assert not together(_candidate(path, "", 5), _candidate(path, "heads.1", 20))  # the root
    assert not together(base, _candidate(path, "heads.1", 20, phase=Phase.BACKWARD))
    assert not together(base, _candidate(path, "heads.1", 5))  # the same lines
    assert not together(base, _candidate(path, "heads.1", 6))  # adjacent lines
    assert not together(base, _candidate(path, "heads.1", 3, span=3))  # overlapping lines
    unsafe = _candidate(path, "heads.1", 20)
    unsafe = replace(unsafe, fix=replace(unsafe.fix, applicability=Applicability.UNSAFE))
    assert not together(base, unsafe)  # --fix would apply one without the other
    other = _candidate(path, "heads.1", 20)
    upstream = Dataflow({other.key: frozenset({base.key})}, frozenset())
    assert not together(base, other, upstream)  # one's values reach the other's op
    assert not together(base, other, Dataflow({}, frozenset({base.key})))  # unconfined
    assert groups([base, other], None) == [[base], [other]]  # no probe: one at a time
    # the probe only runs when the report alone allows some pair
    assert worth_probing([base, other])
    assert not worth_probing([base, _candidate(path, "heads.0", 20), _candidate(path, "", 30)])


def test_in_memory_scan_verifies_the_group_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """``nan_hunter.scan(model, batch)`` probes a copy of the model: one re-scan, all verified,
    and the model's parameters untouched."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_four_heads_in_memory", COUPLED)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # inspect finds the class's file
    spec.loader.exec_module(module)
    model, batch = module.build_model(), module.sample_batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = _count_rescans(monkeypatch)
    report = api.scan(model, batch)
    assert len(calls) == 1
    assert [f.fix.verified for f in report.findings if f.fix is not None] == [True] * 4
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_fix_all_fixes_the_four_coupled_origins_in_one_round(tmp_path: Path) -> None:
    """One at a time, none of the four fixes verified, so ``--fix-all`` had nothing to apply;
    verified together, round 1 writes all four and the model scans clean."""
    from typer.testing import CliRunner

    from nan_hunter.cli import app

    path = tmp_path / COUPLED.name
    path.write_bytes(COUPLED.read_bytes())
    result = CliRunner().invoke(app, ["scan", str(path), "--fix-all", "--no-backup"])
    assert result.exit_code == 0, (result.stderr, result.stdout)
    assert "round 1: fixed NH102, NH103, NH109, NH102 in" in result.stderr, result.stderr
    assert "round 2" not in result.stderr
    assert api.scan_file(str(path), verify=False).errors == 0


# --- the split -----------------------------------------------------------------------------------


class _Fake:
    """Verdicts by rule: a candidate is verified unless it is in ``bad``. A re-scan together:
    ``kind="op"``, a bad member's own op still fails and the others are verified; ``"loss"``,
    the loss changed and no member is verified; ``"crash"``, it does not run."""

    def __init__(self, bad: set[str], kind: str) -> None:
        self.bad, self.kind = bad, kind
        self.rescans: list[tuple[str, ...]] = []

    def one(self, c: PendingFix) -> verify_module.Verdict:
        self.rescans.append((c.finding.module,))
        bad = c.finding.module in self.bad
        return verify_module.Verdict(not bad, (), op_still_fails=bad and self.kind == "op")

    def together(self, group: Any) -> dict[Any, verify_module.Verdict] | None:
        self.rescans.append(tuple(c.finding.module for c in group))
        if self.kind == "crash":
            return None
        any_bad = any(c.finding.module in self.bad for c in group)
        out = {}
        for c in group:
            bad = c.finding.module in self.bad
            if self.kind == "op":
                out[c.key] = verify_module.Verdict(not bad, (), op_still_fails=bad)
            else:
                out[c.key] = verify_module.Verdict(not any_bad, ())
        return out


def _eight(tmp_path: Path) -> list[PendingFix]:
    path = tmp_path / "lines.py"
    path.write_text("".join(f"x{i} = {i}\n" for i in range(1, 41)))
    return [_candidate(path, f"heads.{i}", 1 + 4 * i) for i in range(8)]


ALL_EIGHT = {f"heads.{i}" for i in range(8)}


@pytest.mark.parametrize(
    ("bad", "kind", "rescans"),
    [
        (set(), "op", 1),  # one re-scan for all eight
        ({"heads.5"}, "op", 1 + 1 + 1),  # all; heads.5 alone; the other seven together
        ({"heads.0", "heads.7"}, "op", 1 + 2 + 1),
        (ALL_EIGHT, "op", 1 + 8),  # every failure its own: each alone after the group
        ({"heads.5"}, "loss", 1 + 2 + 2 + 2),  # no one to blame: halves, quarters, singles
        ({"heads.0", "heads.7"}, "loss", 1 + 2 + 4 + 4),
        (ALL_EIGHT, "loss", 15),  # 2n - 1
        (set(), "crash", 15),  # no combined re-scan runs: down to one at a time
    ],
)
def test_split_ends_in_one_at_a_time_verdicts(
    tmp_path: Path, bad: set[str], kind: str, rescans: int
) -> None:
    from nan_hunter.fixes.grouping import verify_groups

    candidates = _eight(tmp_path)
    fake = _Fake(bad, kind)
    verdicts = verify_groups(candidates, Dataflow({}, frozenset()), fake.one, fake.together)
    assert len(fake.rescans) == rescans
    assert {c.finding.module: verdicts[c.key].verified for c in candidates} == {
        c.finding.module: c.finding.module not in bad for c in candidates
    }
    singles = {r[0] for r in fake.rescans if len(r) == 1}
    assert bad <= singles  # every bad fix got its one-at-a-time verdict


def test_without_a_probe_every_fix_is_rescanned_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe that fails (the model raises outside a scan) falls back to one at a time."""

    def failing(report: Report, rescan: Any, entry: Path, probe: Any = None) -> Report:
        def broken(pieces: Any) -> Dataflow:
            raise RuntimeError("the model's forward failed")

        return real(report, counted(rescan), entry, broken)

    calls: list[Path] = []
    real = verify_module.verify_fixes

    def counted(rescan: Any) -> Any:
        def run(shadow_entry: Path) -> Report:
            calls.append(shadow_entry)
            return rescan(shadow_entry)

        return run

    monkeypatch.setattr(api, "verify_fixes", failing)
    report = api.scan_file(str(GUARDED))
    assert len(calls) == 4
    assert all(f.fix is not None and f.fix.verified for f in report.findings)


def test_golden_report_of_the_four_heads(update_golden: bool) -> None:
    """The text report: each fix verified, and re-scanned together with the other three."""
    from nan_hunter.report import render

    rendered = render(replace(scanned(COUPLED), seconds=0.0), "text")
    golden = GOLDEN / "batch_four_heads.txt"
    if update_golden or not golden.exists():
        golden.write_text(rendered, encoding="utf-8")
        if not update_golden:
            pytest.fail(f"{golden.name} did not exist; written now, check it in")
    assert rendered == golden.read_text(encoding="utf-8")


def _alternatives_only(report: Report) -> Report:
    """Each finding's fix made a no-op (its op still fails), with the real fix as its
    alternative: the alternatives must carry the verification."""
    bad = report
    for f in report.findings:
        bad = _bad_edit(bad, f.module, "noop")
    findings = []
    for good, noop in zip(report.findings, bad.findings, strict=True):
        assert good.fix is not None and noop.fix is not None
        findings.append(replace(noop, fix=replace(noop.fix, alternatives=(good.fix,))))
    return replace(report, findings=tuple(findings))


@pytest.mark.parametrize("path", [GUARDED, COUPLED], ids=["guarded", "coupled"])
def test_alternatives_of_failed_fixes_are_verified_in_groups(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The four own fixes fail (each op still fails: each then re-scanned alone, as one at a
    time does), and the four alternatives verify together in one re-scan. One at a time takes
    eight re-scans; on the coupled model it verifies no alternative (the loss), so it goes on
    to each alternative's own next steps, the region with FP32 regions for the ops taking its
    result and the whole forward in FP32 (the two elementwise heads: the upcast operands with
    no region first): eighteen."""
    batched, calls = _verified_scan(path, monkeypatch, batched=True, tamper=_alternatives_only)
    alone, alone_calls = _verified_scan(
        path, monkeypatch, batched=False, tamper=_alternatives_only
    )
    assert (len(calls), len(alone_calls)) == (1 + 4 + 1, 8 if path is GUARDED else 18)
    for f in batched.findings:  # the verified alternative is the fix, the refuted one gone
        assert f.fix is not None and f.fix.verified is True and f.fix.alternatives == ()
    alone_verified = [f.fix.verified for f in alone.findings if f.fix]
    assert alone_verified == [path is GUARDED] * 4
