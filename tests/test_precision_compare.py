"""The precision check's measurements (``precision.compare``): each op's error against FP32
taken in a reused buffer, the same values as ``low.float() - fp32`` gives, and the gradient
cosine taken by chunks, as the flattened FP64 vectors give it."""

from __future__ import annotations

import math

import pytest
import torch

from nan_hunter.precision import compare
from nan_hunter.precision.compare import ErrorMeter, KeptOutputs
from nan_hunter.precision.formats import BF16

DTYPES = [
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),  # a cast the model makes itself: in FP32 first
    (torch.float64, torch.float64),
]


@pytest.mark.parametrize(("low_dtype", "ref_dtype"), DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1000,), (7, 5, 3)], ids=str)
def test_the_error_is_that_of_the_fp32_difference(
    low_dtype: torch.dtype, ref_dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    scratch = compare._Scratch()
    for _ in range(2):  # the buffer reused, and grown
        ref = torch.randn(shape, dtype=ref_dtype)
        low = (ref * 1.001).to(low_dtype)
        if len(shape) > 1:  # a transposed reference: strides of its own
            ref = ref.transpose(0, 1).contiguous().transpose(0, 1)
        diff, mag = scratch.max_abs_diff(low, ref)
        ref32 = ref.float()
        assert diff.item() == (low.float() - ref32).abs().amax().item()
        assert mag.item() == ref32.abs().amax().item()
        assert diff.dtype == mag.dtype == torch.float32
        shape = (*shape[:-1], shape[-1] * 3)


def test_the_gradient_cosine_is_that_of_the_fp64_vectors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compare, "GRAM_CHUNK", 1000)  # several chunks per gradient
    torch.manual_seed(0)
    low = (torch.randn(2500), None, torch.randn(3, 700), torch.randn(4))
    ref = tuple(g + 0.01 * torch.randn_like(g) if g is not None else None for g in low)
    ref = (*ref[:3], torch.randn(5))  # another shape: left out
    keep = KeptOutputs()
    keep.on_gradients(low)
    meter = ErrorMeter(keep, BF16, {})
    meter.on_gradients(ref)
    a = torch.cat([low[0].double(), low[2].double().flatten()])
    b = torch.cat([ref[0].double(), ref[2].double().flatten()])  # type: ignore[union-attr]
    expected = float(a @ b) / math.sqrt(float(a @ a) * float(b @ b))
    assert meter.result().grad_cosine == pytest.approx(expected, abs=1e-12)


def test_no_gradient_to_compare_is_a_cosine_of_1() -> None:
    keep = KeptOutputs()
    keep.on_gradients((None,))
    meter = ErrorMeter(keep, BF16, {})
    meter.on_gradients((torch.ones(3),))
    assert meter.result().grad_cosine == 1.0
