"""A model already in ``.half()`` (or an FP16 batch): the FP32 reference pass runs the model's
and the batch's FP16 tensors in FP32, and the model comes back in FP16, bit-identical."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nan_hunter.api import scan


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():
        m[0].weight.fill_(900.0)
    return m.half()


@pytest.mark.parametrize("mode", ["autocast", "half"])
@pytest.mark.parametrize("batch_dtype", [torch.float32, torch.float16])
def test_a_half_model_gets_its_fp32_reference(mode: str, batch_dtype: torch.dtype) -> None:
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    batch = (torch.randn(4, 8) * 30).to(batch_dtype)
    first = model[0]
    expected = (batch.float() @ first.weight.float().t() + first.bias.float()).abs().max()
    report = scan(model, batch, mode=mode)
    (finding,) = [f for f in report.findings if f.is_error]
    assert finding.code == "NH102"
    assert finding.fp32_rerun is not None and finding.fp32_rerun.finite is True
    assert finding.fp32_rerun.abs_max == pytest.approx(expected.item(), rel=1e-3)
    assert finding.fp32_rerun.abs_max > 65504
    after = model.state_dict()
    assert {k: v.dtype for k, v in after.items()} == {k: v.dtype for k, v in before.items()}
    assert all(torch.equal(after[k], before[k]) for k in before)
