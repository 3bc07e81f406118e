"""The fix search on model code it has not seen: ``tests/fix_shapes/generator.py`` builds small
models (a culprit x how its operands arrive x autocast/half), each of which fails the plain scan;
``--fix-all`` runs on a copy of each.

Never allowed: a fix the first scan labelled verified whose finding's op still fails after
``--fix-all`` (``verified-but-failing``). The clean count may not fall below what the fix
search reaches today (``SAMPLE_CLEAN_FLOOR``, ``FULL_CLEAN_FLOOR``: raise them as it improves);
nor the full set below the product goal, ``CLEAN_TARGET`` (docs/fix_search.md lists what fails).
The default suite runs a 12-model sample; the full set is ``@pytest.mark.slow``.
``python -m tests.fix_shapes.generator --report`` prints a line per model and the rates per
culprit, arrival and mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fix_shapes.generator import (
    ARRIVALS,
    CULPRITS,
    MODES,
    GeneratedModel,
    Outcome,
    generate,
    run_model,
    sample,
)

CLEAN_TARGET = 0.95
"""The goal: clean on 95% of the generated models (392/411 today: docs/fix_search.md)."""
SAMPLE_CLEAN_FLOOR = 12
"""Of the 12 sample models, at least this many end clean (today: 12)."""
FULL_CLEAN_FLOOR = 392
"""Of the 411 models, at least this many end clean (today: 392)."""
LEAN_TARGET = 0.90
"""The goal of issue 36: lean (clean, at no more than the hand-written minimal fix's FP32 plus
2 points of matmul/conv FLOPs) on 90% of the generated models."""
FULL_LEAN_FLOOR = 375
"""Of the 411 models, at least this many end lean (today: 375, 91%; docs/fix_search.md lists
the 36 that do not)."""
SAMPLE_LEAN_FLOOR = 12
"""Of the 12 sample models, at least this many end lean (today: 12)."""
SAMPLE_LEAN = {
    "overflow-attention-module_call-autocast-0": (0.618, 0.618),
    "overflow-inverse-float_attr-autocast-0": (0.928, 0.928),
    "eps-rsqrt_var-float_attr-autocast-0": (0.0, 0.0),
    "eps-rsqrt_var-package-half-0": (0.0, 0.0),
    "clamp-clamp_max-tensor_attr-autocast-0": (0.538, 0.538),
    "clamp-one_minus-size_int-autocast-0": (0.0, 0.0),
    "backward-pow-tensor_attr-half-0": (0.8, 0.8),
    "backward-atan2-package-autocast-0": (0.889, 0.889),
}
"""(fixed, minimal) FP32 matmul/conv shares measured on sample models, to 0.1 point."""
FULL_VARIANTS = 3
"""Seeds per combination in the slow test (411 models, about 4 min on 2 cores)."""


def _run_all(models: list[GeneratedModel], tmp_path: Path) -> list[Outcome]:
    outcomes = []
    for i, model in enumerate(models):
        outcomes.append(run_model(model, tmp_path / f"m{i}"))
    return outcomes


def _check_generated(outcomes: list[Outcome]) -> None:
    """Every model fails the plain scan: one that does not is a bug of the generator."""
    bad = [f"{o.model.id}: exit {o.plain_code} {o.plain_errors[:1]}" for o in outcomes
           if not o.fails_plain]
    assert not bad, "generator bug, the plain scan does not fail:\n" + "\n".join(bad)


def _check_no_verified_but_failing(outcomes: list[Outcome]) -> None:
    bad = [o.line() for o in outcomes if o.result == "verified-but-failing"]
    assert not bad, "a fix labelled verified left its op failing:\n" + "\n".join(bad)


def _check_clean_count(outcomes: list[Outcome], floor: int) -> None:
    clean = sum(o.result == "clean" for o in outcomes)
    lines = "\n".join(o.line() for o in outcomes if o.result != "clean")
    assert clean >= floor, (
        f"the fix search ends clean on {clean}/{len(outcomes)} generated models, fewer than "
        f"the {floor} it reached (goal {CLEAN_TARGET:.0%}); not clean:\n{lines}"
    )


def test_the_sample_covers_every_culprit_arrival_and_mode() -> None:
    models = sample()
    assert len(models) == 12
    assert {m.culprit for m in models} == set(CULPRITS)
    assert {m.arrival for m in models} == set(ARRIVALS)
    assert {m.mode for m in models} == set(MODES)


def test_the_generator_is_seeded_and_varied() -> None:
    first = generate(2)
    again = generate(2)
    assert [m.files for m in first] == [m.files for m in again]
    assert len({m.id for m in first}) == len(first)
    # two seeds of one combination are different files (names, sizes, constants)
    by_combo: dict[tuple[str, str, str, str], set[str]] = {}
    for m in first:
        by_combo.setdefault((m.culprit, m.shape, m.arrival, m.mode), set()).add(
            m.files[m.entry] + "".join(v for k, v in m.files.items() if k != m.entry)
        )
    same = [k for k, texts in by_combo.items() if len(texts) < 2]
    assert len(same) <= len(by_combo) // 10, same
    for m in first:
        for text in m.files.values():
            compile(text, m.id, "exec")


@pytest.fixture(scope="module")
def sample_outcomes(tmp_path_factory: pytest.TempPathFactory) -> list[Outcome]:
    return _run_all(sample(), tmp_path_factory.mktemp("fix-shapes-sample"))


def test_sample_models_fail_the_plain_scan(sample_outcomes: list[Outcome]) -> None:
    _check_generated(sample_outcomes)


def _check_minimal_fixes(outcomes: list[Outcome]) -> None:
    """Every hand-written minimal fix is a fix: its scan has no error (a generator bug
    otherwise), and the lean figure compares against what was scanned, not a claim."""
    bad = [f"{o.model.id}: {o.minimal_errors[:1]}" for o in outcomes if not o.minimal_fixes]
    assert not bad, "a hand-written minimal fix leaves an error:\n" + "\n".join(bad)


def test_sample_minimal_fixes_scan_clean(sample_outcomes: list[Outcome]) -> None:
    _check_minimal_fixes(sample_outcomes)
    assert all(o.minimal_fp32 is not None for o in sample_outcomes)


def test_sample_no_verified_fix_leaves_its_op_failing(sample_outcomes: list[Outcome]) -> None:
    _check_no_verified_but_failing(sample_outcomes)


def test_sample_clean_count_does_not_fall(sample_outcomes: list[Outcome]) -> None:
    _check_clean_count(sample_outcomes, SAMPLE_CLEAN_FLOOR)


def _check_lean_count(outcomes: list[Outcome], floor: int) -> None:
    lean = sum(o.lean for o in outcomes)
    lines = "\n".join(o.line() + f" FP32 {o.fixed_fp32} (minimal {o.minimal_fp32})"
                      for o in outcomes if not o.lean)
    assert lean >= floor, (
        f"lean on {lean}/{len(outcomes)} generated models, fewer than the {floor} it reached "
        f"(goal {LEAN_TARGET:.0%}); not lean:\n{lines}"
    )


def test_sample_lean_count_does_not_fall(sample_outcomes: list[Outcome]) -> None:
    _check_lean_count(sample_outcomes, SAMPLE_LEAN_FLOOR)


def test_sample_costs_are_measured_by_scanning_the_files(sample_outcomes: list[Outcome]) -> None:
    """The attention's fix keeps exactly the hand-written fix's FP32 (its scores matmul, 61.8%
    of the FLOPs with the projections in FP16); the inverse's solve already ran in FP32 by hand
    (92.8%); the eps changed and the elementwise ops upcast after the Linear move none; the
    Linears taking exp's 1e5 (the block's ``mix``, the parent's head) in FP32 are 53.8%; the
    backward shapes' own Linear, whose gradient is beyond 65504 even in FP32, is 80% and
    88.9%."""
    measured = {
        o.model.id: (round(o.fixed_fp32 or 0.0, 3), round(o.minimal_fp32 or 0.0, 3))
        for o in sample_outcomes if o.model.id in SAMPLE_LEAN
    }
    assert measured == SAMPLE_LEAN


@pytest.fixture(scope="module")
def full_outcomes(tmp_path_factory: pytest.TempPathFactory) -> list[Outcome]:
    return _run_all(generate(FULL_VARIANTS), tmp_path_factory.mktemp("fix-shapes-full"))


@pytest.mark.slow
def test_full_models_fail_the_plain_scan(full_outcomes: list[Outcome]) -> None:
    _check_generated(full_outcomes)


@pytest.mark.slow
def test_full_minimal_fixes_scan_clean(full_outcomes: list[Outcome]) -> None:
    _check_minimal_fixes(full_outcomes)


@pytest.mark.slow
def test_full_no_verified_fix_leaves_its_op_failing(full_outcomes: list[Outcome]) -> None:
    _check_no_verified_but_failing(full_outcomes)


@pytest.mark.slow
def test_full_clean_count_does_not_fall(full_outcomes: list[Outcome]) -> None:
    _check_clean_count(full_outcomes, FULL_CLEAN_FLOOR)


@pytest.mark.slow
def test_full_lean_count_does_not_fall(full_outcomes: list[Outcome]) -> None:
    _check_lean_count(full_outcomes, FULL_LEAN_FLOOR)


@pytest.mark.slow
def test_full_lean_rate(full_outcomes: list[Outcome]) -> None:
    lean = sum(o.lean for o in full_outcomes)
    assert lean >= LEAN_TARGET * len(full_outcomes), (
        f"lean on {lean}/{len(full_outcomes)}, below the goal of {LEAN_TARGET:.0%}"
    )


@pytest.mark.slow
def test_full_clean_rate_reaches_the_goal(full_outcomes: list[Outcome]) -> None:
    clean = sum(o.result == "clean" for o in full_outcomes)
    assert clean >= CLEAN_TARGET * len(full_outcomes), (
        f"clean on {clean}/{len(full_outcomes)}, below the goal of {CLEAN_TARGET:.0%}"
    )
