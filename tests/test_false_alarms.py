"""No false alarm on patterns real architectures use (issue 38).

- a module returning a view of its parameter (Perceiver's ``latents.expand``) is seen;
- a forward recomputed in the backward (Reformer's reversible layers) is a "not checked" note,
  not NH003;
- ops the tracer did not see are a warning (NH003): a gap in what was checked, said, that does
  not fail the scan unless warnings do.
"""

from __future__ import annotations

from pathlib import Path

from nan_hunter.findings import Severity
from tests.conftest import FIXTURES, scanned


def test_a_view_of_a_parameter_returned_by_a_module_is_seen() -> None:
    report = scanned(FIXTURES / "fx_expanded_parameter.py")
    assert report.findings == ()
    assert report.target.unchecked == ()
    assert report.exit_code() == 0


def test_a_forward_recomputed_in_the_backward_is_a_note_not_a_finding() -> None:
    report = scanned(FIXTURES / "fx_reversible_layers.py")
    assert report.findings == ()
    assert report.target.unchecked == (
        "the forward of block.g.0 and 5 more modules recomputed in the backward (reversible "
        "layers, activation checkpointing): not traced op by op; the forward it repeats was",
    )
    assert report.exit_code() == 0


def test_unseen_ops_are_a_warning_that_fails_only_on_warning(tmp_path: Path) -> None:
    from tests.hostile.cases import HIDDEN_IN_A_SUBMODULE

    path = tmp_path / "model.py"
    path.write_text(HIDDEN_IN_A_SUBMODULE)
    report = scanned(path)
    (finding,) = report.findings
    assert (finding.code, finding.severity, finding.module) == ("NH003", Severity.WARNING, "gram")
    assert report.target.unchecked == ("ops the tracer did not see computed the output of gram",)
    assert (report.exit_code(), report.exit_code("warning")) == (0, 1)
