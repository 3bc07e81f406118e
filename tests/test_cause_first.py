"""The change the cause calls for comes first: an unsafe fix measured harmless (its verified
change of the FP32 loss below the verification's tolerance) is what the defaults take; one
beyond it is passed over for the safe fix, and named."""

from __future__ import annotations

from dataclasses import replace

from nan_hunter.findings import (
    Applicability,
    Edit,
    Finding,
    Fix,
    Kind,
    Phase,
    Report,
    ScanTarget,
    Severity,
    loss_change_text,
)
from nan_hunter.fixes.select import select_fixes

EPS = Fix("Use an eps float16 can hold", Applicability.UNSAFE,
          (Edit("m.py", 0, 5, "1e-4\n"),), verified=True, fp32_loss_change=0.0002)
REGION = Fix("Compute it in FP32", Applicability.SAFE, (Edit("m.py", 10, 20, "region\n"),),
             verified=True)


def _report(fix: Fix) -> Report:
    finding = Finding("NH201", Severity.ERROR, Kind.UNDERFLOW, Phase.FORWARD, "Tensor.__add__",
                      "norm", None, True, "eps", fix=fix)
    return Report(ScanTarget("m.py", "autocast", "float16", "cpu", "cuda"), (finding,), 1, 0, 0,
                  0.0)


def test_an_unsafe_fix_measured_harmless_is_taken_by_default() -> None:
    selection = select_fixes(_report(replace(EPS, alternatives=(REGION,))))
    assert [fix.title for _, fix in selection.chosen] == ["Use an eps float16 can hold"]
    assert selection.passed_over == ()


def test_an_unsafe_fix_beyond_the_tolerance_is_passed_over_and_named() -> None:
    costly = replace(EPS, fp32_loss_change=-0.073, alternatives=(REGION,))
    selection = select_fixes(_report(costly))
    assert [fix.title for _, fix in selection.chosen] == ["Compute it in FP32"]
    assert [fix.title for _, fix in selection.passed_over] == ["Use an eps float16 can hold"]
    assert [fix.title for _, fix in select_fixes(_report(costly), unsafe=True).chosen] == [
        "Use an eps float16 can hold"
    ]


def test_an_unmeasured_or_unverified_unsafe_fix_still_needs_the_flag() -> None:
    for fix in (replace(EPS, fp32_loss_change=None), replace(EPS, verified=False)):
        selection = select_fixes(_report(fix))
        assert selection.chosen == ()
    assert select_fixes(_report(replace(EPS, fp32_loss_change=None))).skipped[0][1] == (
        "unsafe fix (use --unsafe-fixes)"
    )
    assert select_fixes(_report(replace(EPS, fp32_loss_change=0.3))).skipped[0][1] == (
        "unsafe fix (FP32 loss changes by 30%; use --unsafe-fixes)"
    )


def test_the_measured_change_reads_as_a_percentage() -> None:
    assert loss_change_text(0.000192) == "FP32 loss changes by 0.019%"
    assert loss_change_text(-0.073) == "FP32 loss changes by 7.3%"
    assert loss_change_text(0.259) == "FP32 loss changes by 26%"
