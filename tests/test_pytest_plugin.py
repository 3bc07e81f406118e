"""The pytest plugin: ``assert_amp_safe`` and the ``amp_safe`` fixture, in generated test files."""

from __future__ import annotations

import textwrap
from importlib.metadata import entry_points

import pytest
import torch
from torch import nn

from nan_hunter.findings import Report
from nan_hunter.pytest_plugin import assert_amp_safe

pytest_plugins = ["pytester"]

MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Clean(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            return torch.relu(self.fc(x))


    class Overflow(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            with torch.no_grad():
                self.fc.weight.uniform_(50.0, 150.0)
                self.fc.bias.zero_()

        def forward(self, x):
            return self.fc(x)  # <- overflow


    class Expand(nn.Module):
        def forward(self, x):
            return torch.exp(x)


    class WarningOnly(nn.Module):
        # exp gives ~1.6e5 in FP32 and leaves its module; log brings it back before any cast.
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.expand = Expand()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(self.expand(x).log())


    def small_batch():
        torch.manual_seed(0)
        return torch.randn(4, 8)


    def big_batch():
        torch.manual_seed(0)
        return 100.0 + 100.0 * torch.rand(4, 8)


    def warm_batch():
        torch.manual_seed(0)
        return 11.5 + torch.rand(4, 8)
    """
)

TESTS = textwrap.dedent(
    """
    from nan_hunter.pytest_plugin import assert_amp_safe

    from models import Clean, Overflow, WarningOnly, big_batch, small_batch, warm_batch


    def test_clean_passes():
        report = assert_amp_safe(Clean(), small_batch())
        assert report.status == "clean"


    def test_overflow_fails():
        assert_amp_safe(Overflow(), big_batch())


    def test_fixture_clean(amp_safe):
        amp_safe(Clean(), small_batch(), backward=False)


    def test_fixture_overflow(amp_safe):
        amp_safe(Overflow(), big_batch())


    def test_bfloat16_is_safe(amp_safe):
        amp_safe(Overflow(), big_batch(), dtype="bfloat16")


    def test_warning_passes_by_default():
        report = assert_amp_safe(WarningOnly(), warm_batch())
        assert [f.code for f in report.findings] == ["NH501"]


    def test_warning_fails_with_fail_on_warning():
        assert_amp_safe(WarningOnly(), warm_batch(), fail_on="warning")
    """
)


def test_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    found = [e for e in entry_points(group="pytest11") if e.name == "nan_hunter"]
    assert [e.value for e in found] == ["nan_hunter.pytest_plugin"]


def test_generated_tests_pass_and_fail_as_expected(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On CI (CI=true) pytest prints whole failure messages in its short summary too.
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    pytester.makepyfile(models=MODELS, test_amp=TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4, failed=3)
    out = result.stdout.str()
    # Each failure's message is the text report, not a Python traceback of the plugin.
    result.stdout.re_match_lines(
        [
            r"_+ test_overflow_fails _+",
            r"nan-hunter models\.py: autocast float16 on (cpu|cuda) \(policy cuda, GradScaler "
            r"2\*\*16, dynamic\)$",
            r"error\[NH102\] overflow: torch\.nn\.functional\.linear output exceeds",
            r"  --> models\.py:\d+$",
            r"   \|  return self\.fc\(x\)  # <- overflow$",
            r"_+ test_fixture_overflow _+",
            r"error\[NH102\]",
            r"_+ test_warning_fails_with_fail_on_warning _+",
            r"warning\[NH501\] .*torch\.exp",
        ]
    )
    assert out.count("error[NH1") == 2
    # the plugin's report carries fixes verified by a re-scan of the patched test module
    assert out.count("[safe, verified by re-scan;") == 2
    assert "pytest_plugin.py" not in out
    assert "FAILED test_amp.py::test_overflow_fails" in out
    assert "FAILED test_amp.py::test_fixture_overflow" in out
    assert "FAILED test_amp.py::test_warning_fails_with_fail_on_warning" in out
    assert "test_warning_passes_by_default" not in out


def test_fixture_is_autoloaded_in_a_fresh_process(pytester: pytest.Pytester) -> None:
    """A subprocess, so only the installed entry point can bring the ``amp_safe`` fixture; the
    plugin must not import torch until it is used (it loads in every pytest run)."""
    pytester.makepyfile(
        test_fixture=textwrap.dedent(
            """
            import sys


            def test_fixture_is_there(amp_safe):
                assert amp_safe.__name__ == "assert_amp_safe"
                assert "torch" not in sys.modules
            """
        )
    )
    # Other plugins off where installed (hypothesis alone takes ~2 s to import).
    quiet = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark")
    result = pytester.runpytest_subprocess(*quiet, "-q")
    result.assert_outcomes(passed=1)
    disabled = pytester.runpytest("-p", "no:nan_hunter", "-p", "no:cacheprovider")
    disabled.assert_outcomes(errors=1)
    disabled.stdout.fnmatch_lines(["*fixture 'amp_safe' not found*"])


class _Warm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x)


def test_assert_amp_safe_returns_the_report_when_it_passes() -> None:
    torch.manual_seed(0)
    report = assert_amp_safe(nn.Linear(8, 4), torch.randn(4, 8), dtype=torch.float16)
    assert isinstance(report, Report)
    assert report.status == "clean"
    assert report.target.dtype == "float16"
    assert report.target.policy == "cuda"


def test_assert_amp_safe_fails_with_the_report_as_message() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    with torch.no_grad():
        model.weight.uniform_(50.0, 150.0)
    with pytest.raises(pytest.fail.Exception) as failed:
        assert_amp_safe(model, 100.0 + 100.0 * torch.rand(4, 8), policy="native")
    message = str(failed.value)
    assert "error[NH102]" in message
    assert "(policy native, GradScaler 2**16, dynamic)" in message
    assert not failed.value.pytrace


def test_assert_amp_safe_rejects_a_bad_fail_on() -> None:
    with pytest.raises(ValueError, match="fail_on must be one of error, warning"):
        assert_amp_safe(nn.Linear(2, 2), torch.ones(1, 2), fail_on="info")
