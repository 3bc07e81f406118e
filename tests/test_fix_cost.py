"""The least FP32 that works (issue 36): each candidate's cost measured in its re-scan, the
cheapest verified one kept, and the culprit op alone tried before its statement."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from nan_hunter.api import scan_file
from nan_hunter.core.location import SourceLocation
from nan_hunter.findings import (
    Applicability,
    Edit,
    Finding,
    Fix,
    FixCost,
    Kind,
    Phase,
    Report,
    ScanTarget,
    Severity,
)
from nan_hunter.fixes.cost import choose, covers
from nan_hunter.fixes.verify import MAX_RESCANS, verify_fix, verify_fixes
from nan_hunter.report import render
from nan_hunter.trace.flops import matmul_flops
from nan_hunter.trace.summary import TensorStats

FIXTURES = Path(__file__).parent / "fixtures"
EINSUM = FIXTURES / "fx_einsum_beside_linear.py"
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "nan_hunter" / "report" / "report.schema.json"

# fx_einsum_beside_linear: batch 4 x 64 tokens; the einsum 32 -> 32, block.big 256 -> 32, the
# head 32 -> 8: 2 FLOPs per multiply-add
EINSUM_FLOPS = 2 * 4 * 64 * 32 * 32
BIG_FLOPS = 2 * 4 * 64 * 256 * 32
HEAD_FLOPS = 2 * 4 * 64 * 32 * 8
ALL_FLOPS = EINSUM_FLOPS + BIG_FLOPS + HEAD_FLOPS


def _calls() -> list[tuple[str, tuple[object, ...], dict[str, object]]]:
    torch.manual_seed(0)
    x, w = torch.randn(4, 8, 16), torch.randn(12, 16)
    a, b = torch.randn(3, 5, 7), torch.randn(3, 7, 2)
    img, kernel = torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 4)
    return [
        ("linear", (x, w), {}),
        ("matmul", (a, b), {}),
        ("bmm", (a, b), {}),
        ("einsum", ("bij,bjk->bik", a, b), {}),
        ("einsum", ("...ij,...jk->...ik", a, b), {}),
        ("addmm", (torch.randn(5, 2), a[0], b[0]), {}),
        ("conv2d", (img, kernel), {"groups": 2}),
        ("scaled_dot_product_attention", (q, k, v), {}),
    ]


_FUNCS = {
    "linear": F.linear, "matmul": torch.matmul, "bmm": torch.bmm, "einsum": torch.einsum,
    "addmm": torch.addmm, "conv2d": F.conv2d,
    "scaled_dot_product_attention": F.scaled_dot_product_attention,
}


@pytest.mark.parametrize("index", range(8))
def test_flops_are_torch_flop_counters(index: int) -> None:
    """Each formula gives what torch.utils.flop_counter counts for the same call."""
    name, args, kwargs = _calls()[index]
    func = _FUNCS[name]
    with FlopCounterMode(display=False) as counter:
        out = func(*args, **kwargs)
    assert matmul_flops(name, args, kwargs, [out]) == counter.get_total_flops() > 0


def test_an_elementwise_op_has_no_flops() -> None:
    x = torch.ones(3, 4)
    assert matmul_flops("add", (x, x), {}, [x + x]) == 0


@pytest.fixture(scope="module")
def einsum_report() -> Report:
    return scan_file(str(EINSUM))


def _finding(report: Report) -> Finding:
    (finding,) = [f for f in report.findings if f.is_error]
    return finding


def test_the_einsum_alone_is_the_fix_not_its_statement(einsum_report: Report) -> None:
    """The einsum overflows beside a Linear that holds 86% of the model's FLOPs: the fix takes
    the einsum alone out of the statement (10.8% of the FLOPs in FP32), not the statement (which
    would run the Linear in FP32 too). Its result does not fit FP16 and is not cast back."""
    fix = _finding(einsum_report).fix
    assert fix is not None and fix.verified is True and fix.alternatives == ()
    assert fix.diff == (
        "--- a/tests/fixtures/fx_einsum_beside_linear.py\n"
        "+++ b/tests/fixtures/fx_einsum_beside_linear.py\n"
        "@@ -27,7 +27,9 @@\n"
        " \n"
        "     def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "         u = x[..., :32] * 300.0\n"
        '-        y = self.big(x) + torch.einsum("btd,de->bte", u, self.w) * 1e-3  # <- culprit\n'
        '+        with torch.autocast(device_type="cuda", enabled=False):\n'
        '+            einsum_fp32 = torch.einsum("btd,de->bte", u, self.w)\n'
        "+        y = self.big(x) + einsum_fp32 * 1e-3  # <- culprit\n"
        "         return y\n"
        " \n"
        " \n"
    )
    assert fix.cost is not None
    assert fix.cost.baseline_matmul_share == 0.0
    assert fix.cost.added_matmul_share == pytest.approx(EINSUM_FLOPS / ALL_FLOPS)  # 0.108
    assert not fix.cost.shared and not fix.cost.most_of_the_model
    assert einsum_report.precision is not None
    assert einsum_report.precision.matmul_flops == ALL_FLOPS


def test_the_statement_region_would_cost_the_linear_too(einsum_report: Report) -> None:
    """What the search before issue 36 kept (the first rung, the statement's region): verified
    as well, at 97% of the model's FLOPs in FP32."""
    unverified = scan_file(str(EINSUM), verify=False)
    finding = _finding(unverified)
    assert finding.fix is not None
    statement = finding.fix.alternatives[0]
    assert statement.title == "Compute torch.einsum in FP32 (autocast disabled)"
    verdict = verify_fix(statement, finding, unverified, _rescan, EINSUM)
    assert verdict.verified and verdict.cost is not None
    assert verdict.cost.added_matmul_share == pytest.approx(
        (EINSUM_FLOPS + BIG_FLOPS) / ALL_FLOPS
    )
    assert verdict.cost.most_of_the_model
    assert covers(statement, finding.fix)  # so the search never re-scans it after the einsum's


def _rescan(entry: Path) -> Report:
    return scan_file(str(entry), verify=False)


def test_the_text_report_says_what_the_fix_keeps_in_fp16(einsum_report: Report) -> None:
    text = render(einsum_report, "text")
    assert (
        "[safe, verified by re-scan; keeps 89.2% of matmul/conv FLOPs in FP16 (moves 10.8% to "
        "FP32; elementwise 50.0%)]"
    ) in text.replace("\n  ", " ")


def test_the_json_report_carries_the_cost(einsum_report: Report) -> None:
    data = json.loads(render(einsum_report, "json"))
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))
    (finding,) = [f for f in data["findings"] if f["severity"] == "error"]
    cost = finding["fix"]["cost"]
    assert cost["added_matmul_share"] == pytest.approx(EINSUM_FLOPS / ALL_FLOPS)
    assert cost["baseline_matmul_share"] == 0.0
    assert cost["shared"] is False and cost["low_precision"] == "FP16"
    bad = json.loads(json.dumps(data))
    bad["findings"][0]["fix"]["cost"]["fp32_matmul_share"] = 1.5
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, json.loads(SCHEMA_FILE.read_text()))


def _fix(title: str, line: int, added: float, *, verified: bool | None = True,
         applicability: Applicability = Applicability.SAFE) -> Fix:
    cost = FixCost(added, 0.0, 0.0, 0.0)
    return Fix(title, applicability, (Edit("m.py", line, line + 1, "x"),),
               diff=f"+{title}\n", verified=verified, cost=cost)


def test_the_cheapest_verified_candidate_leads_whatever_its_rung() -> None:
    """The ladder's first verified rung is the whole model (90%); a later, narrower one (2%)
    is kept, and the costly one ranked after it; a refuted one is not shown."""
    whole = _fix("whole", 1, 0.9)
    refuted = _fix("refuted", 2, 0.0, verified=False)
    narrow = _fix("narrow", 3, 0.02)
    chosen = choose(replace(whole, alternatives=(refuted, narrow)))
    assert [f.title for f in (chosen, *chosen.alternatives)] == ["narrow", "whole"]
    assert chosen.alternatives[0].cost is not None
    assert chosen.alternatives[0].cost.most_of_the_model


def test_a_safe_refuted_candidate_stays_before_an_unsafe_verified_one() -> None:
    """An unsafe fix (a larger eps) verifies, the safe region does not: the region stays first,
    so that --fix without --unsafe-fixes says why no safe fix was taken."""
    region = _fix("region", 1, 0.0, verified=False)
    eps = _fix("eps", 2, 0.0, applicability=Applicability.UNSAFE)
    chosen = choose(replace(region, alternatives=(eps,)))
    assert [f.title for f in (chosen, *chosen.alternatives)] == ["region", "eps"]


def _ladder_of(path: Path, n: int) -> Finding:
    """A finding whose fix has ``n`` candidates, one per line of ``path``."""
    lines = path.read_text().splitlines(keepends=True)
    offsets = [sum(len(line) for line in lines[:i]) for i in range(len(lines) + 1)]
    fixes = [
        Fix(f"candidate {i}", Applicability.SAFE,
            (Edit(str(path), offsets[i], offsets[i + 1], f"x{i} = -{i}\n"),), diff=f"+{i}\n")
        for i in range(n)
    ]
    return Finding(
        code="NH102", severity=Severity.ERROR, kind=Kind.OVERFLOW, phase=Phase.FORWARD,
        op="torch.matmul", module="block", location=SourceLocation(str(path), 1, "x0 = 0"),
        origin=True, message="overflow", fix=replace(fixes[0], alternatives=tuple(fixes[1:])),
    )


def test_a_findings_search_stops_after_six_rescans(tmp_path: Path) -> None:
    """Eight candidates, none verifying (the loss stays non-finite): six re-scans, the last
    two candidates left untried (``verified`` None)."""
    path = tmp_path / "model.py"
    path.write_text("".join(f"x{i} = {i}\n" for i in range(8)))
    finite = TensorStats((), "float32", 1, min=1.0, max=1.0, abs_max=1.0)
    report = Report(
        ScanTarget(str(path), "autocast", "float16", "cpu", "cuda"), (_ladder_of(path, 8),),
        1, 0, 0, 0.0, reference_loss=finite,
    )
    rescans: list[Path] = []

    def rescan(entry: Path) -> Report:
        rescans.append(entry)
        return replace(report, findings=(), loss=TensorStats((), "float32", 1, nan=1))

    fix = verify_fixes(report, rescan, path).findings[0].fix
    assert fix is not None
    assert len(rescans) == MAX_RESCANS == 6
    assert [f.verified for f in (fix, *fix.alternatives)] == [False] * 6 + [None] * 2
