"""pytest plugin: fail a test when a model breaks under FP16 autocast.

Installed with nan-hunter (entry point ``pytest11``), so any test can use::

    from nan_hunter.pytest_plugin import assert_amp_safe

    def test_model_is_amp_safe():
        assert_amp_safe(build_model(), sample_batch())

or the ``amp_safe`` fixture, which is that same function::

    def test_model_is_amp_safe(amp_safe):
        amp_safe(build_model(), sample_batch(), loss_fn=my_loss)

A failing test shows the text report (culprit op, module, source line, fix) as its message.
Disable the plugin with ``-p no:nan_hunter``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import torch

    from nan_hunter.core.batch import LossFn
    from nan_hunter.findings import Report

_FAIL_ON = ("error", "warning")


def assert_amp_safe(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: LossFn | None = None,
    *,
    dtype: torch.dtype | str | None = None,
    policy: str = "cuda",
    fail_on: str = "error",
    **options: Any,
) -> Report:
    """Scan ``model`` on ``batch`` with ``nan_hunter.scan`` and fail the test when it reports a
    finding at or above ``fail_on`` (``"error"``, or ``"warning"`` for warnings too).

    ``dtype`` is ``torch.float16`` (the default) or ``torch.bfloat16`` (or their names); ``policy``
    and ``options`` are passed on to ``nan_hunter.scan`` (``backward=False``, ``ignore=["NH5"]``,
    ...). Returns the report when the test may go on, so it can be checked further.
    """
    __tracebackhide__ = True
    import torch

    from nan_hunter.api import scan
    from nan_hunter.report import render

    if fail_on not in _FAIL_ON:
        raise ValueError(f"fail_on must be one of {', '.join(_FAIL_ON)}, got {fail_on!r}")
    report = scan(
        model,
        batch,
        loss_fn,
        dtype=torch.float16 if dtype is None else dtype,
        policy=policy,
        fail_on=fail_on,
        **options,
    )
    if report.exit_code(fail_on) != 0:
        pytest.fail(render(report, width=100), pytrace=False)
    return report


@pytest.fixture
def amp_safe() -> Any:
    """``assert_amp_safe``: scan a model under FP16 autocast and fail on a finding."""
    return assert_amp_safe
