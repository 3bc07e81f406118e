"""Tests for ``nan_hunter.trace.stats``: per-tensor statistics, their rendering, number format."""

from __future__ import annotations

import pytest
import torch

from nan_hunter.precision.formats import BF16, FP16
from nan_hunter.trace.stats import TensorStats, dtype_name, format_number, tensor_stats

NAN = float("nan")
INF = float("inf")
FP16_SMALLEST_NORMAL = 2.0**-14  # 6.103515625e-05


def test_fp16_smallest_normal_is_what_tiny_counts_against() -> None:
    assert FP16.smallest_normal == FP16_SMALLEST_NORMAL


def test_nonfinite_zeros_and_fp16_subnormal_values_in_float32() -> None:
    t = torch.tensor(
        [NAN, INF, -INF, INF, 0.0, -0.0, 2.0**-20, -(2.0**-16), FP16_SMALLEST_NORMAL, -3.0, 70000.0]
    )
    s = tensor_stats(t)
    assert s.shape == (11,)
    assert s.dtype == "float32"
    assert s.numel == 11
    assert s.nan == 1
    assert s.posinf == 2
    assert s.neginf == 1
    assert s.nonfinite == 4
    assert not s.finite
    assert s.zeros == 2
    assert s.tiny == 2  # 2**-20 and -2**-16; the smallest normal itself is not tiny
    assert s.min == -3.0
    assert s.max == 70000.0
    assert s.abs_max == 70000.0
    assert s.is_floating


def test_abs_max_comes_from_the_negative_side() -> None:
    s = tensor_stats(torch.tensor([[-512.0, 1.0], [2.0, 0.5]]))
    assert s.shape == (2, 2)
    assert (s.min, s.max, s.abs_max) == (-512.0, 2.0, 512.0)
    assert s.finite
    assert (s.nan, s.posinf, s.neginf, s.zeros, s.tiny) == (0, 0, 0, 0, 0)
    assert s.exceeds(511.0)
    assert not s.exceeds(512.0)


def test_only_nonfinite_values_have_no_min_max() -> None:
    s = tensor_stats(torch.tensor([NAN, -INF, NAN]))
    assert (s.nan, s.posinf, s.neginf) == (2, 0, 1)
    assert s.min is None
    assert s.max is None
    assert s.abs_max is None
    assert s.zeros == 0
    assert s.tiny == 0
    assert not s.exceeds(0.0)


def test_float16_input() -> None:
    t = torch.tensor(
        [2.0**-24, 2.0**-14, -(2.0**-15), 65504.0, 0.0, NAN, -INF], dtype=torch.float16
    )
    s = tensor_stats(t)
    assert s.dtype == "float16"
    assert s.numel == 7
    assert (s.nan, s.posinf, s.neginf) == (1, 0, 1)
    assert s.zeros == 1
    assert s.tiny == 2  # 2**-24 (smallest subnormal) and -2**-15
    assert s.min == -(2.0**-15)
    assert s.max == 65504.0
    assert s.abs_max == 65504.0


def test_bfloat16_input_with_its_own_format() -> None:
    t = torch.tensor([1e-5, 1.0], dtype=torch.bfloat16)
    assert tensor_stats(t, BF16).tiny == 0  # 1e-5 is a normal bfloat16 number
    assert tensor_stats(t, FP16).tiny == 1  # ... but below FP16's smallest normal
    assert tensor_stats(t).dtype == "bfloat16"


def test_float64_tiny_against_fp16() -> None:
    t = torch.tensor([1e-300, 1e-5, 1e-4], dtype=torch.float64)
    s = tensor_stats(t)
    assert s.dtype == "float64"
    assert s.tiny == 2
    assert s.min == 1e-300
    assert s.max == 1e-4


@pytest.mark.parametrize(
    ("t", "dtype"),
    [
        (torch.tensor([[1, -2, 3]]), "int64"),
        (torch.tensor([0, 1], dtype=torch.int32), "int32"),
        (torch.tensor([True, False, True]), "bool"),
        (torch.tensor([1 + 2j]), "complex64"),
    ],
)
def test_non_floating_tensors_get_shape_and_dtype_only(t: torch.Tensor, dtype: str) -> None:
    s = tensor_stats(t)
    assert s == TensorStats(shape=tuple(t.shape), dtype=dtype, numel=t.numel())
    assert s.min is None
    assert s.max is None
    assert s.finite
    assert not s.is_floating


def test_empty_tensor() -> None:
    s = tensor_stats(torch.empty(0, 3))
    assert s == TensorStats(shape=(0, 3), dtype="float32", numel=0)
    assert s.render() == "tensor[0, 3] float32 empty"


def test_zero_dim_tensor() -> None:
    s = tensor_stats(torch.tensor(-2.5))
    assert s.shape == ()
    assert s.numel == 1
    assert (s.min, s.max, s.abs_max) == (-2.5, -2.5, 2.5)
    assert s.render() == "tensor[] float32 x∈[-2.5, -2.5]"


def test_zero_dim_nan() -> None:
    s = tensor_stats(torch.tensor(NAN))
    assert (s.shape, s.numel, s.nan) == ((), 1, 1)
    assert s.render() == "tensor[] float32 no finite values NaN×1"


def test_stats_do_not_need_grad_and_keep_the_input() -> None:
    t = torch.tensor([1.0, -4.0], requires_grad=True)
    s = tensor_stats(t * 2)
    assert (s.min, s.max) == (-8.0, 2.0)
    assert t.grad is None


# -- render -----------------------------------------------------------------------------------


def test_render_with_everything() -> None:
    t = torch.tensor([[1.5, -3500.0, INF], [INF, -INF, NAN]], dtype=torch.float16)
    assert tensor_stats(t).render() == "tensor[2, 3] float16 x∈[-3500, 1.5] +inf×2 -inf×1 NaN×1"


def test_render_scientific_bounds() -> None:
    t = torch.tensor([4.1e-05, 70000.0])
    assert tensor_stats(t).render() == "tensor[2] float32 x∈[4.10e-05, 7.00e+04]"


def test_render_only_nonfinite() -> None:
    s = tensor_stats(torch.tensor([INF, -INF]))
    assert s.render() == "tensor[2] float32 no finite values +inf×1 -inf×1"


def test_render_zeros() -> None:
    s = tensor_stats(torch.zeros(3, 1, 2))
    assert s.render() == "tensor[3, 1, 2] float32 x∈[0, 0]"


def test_render_integer_tensor_is_shape_and_dtype() -> None:
    assert tensor_stats(torch.tensor([1, 2, 3])).render() == "tensor[3] int64"
    assert tensor_stats(torch.tensor([True])).render() == "tensor[1] bool"


def test_to_dict() -> None:
    s = tensor_stats(torch.tensor([NAN, 0.0, 2.0**-20, -2.0]))
    assert s.to_dict() == {
        "shape": [4],
        "dtype": "float32",
        "numel": 4,
        "min": -2.0,
        "max": 2.0**-20,
        "abs_max": 2.0,
        "nan": 1,
        "posinf": 0,
        "neginf": 0,
        "zeros": 1,
        "tiny": 1,
    }


def test_float8_tensor_does_not_crash() -> None:
    t = torch.tensor([1.0, -2.0]).to(torch.float8_e4m3fn)
    s = tensor_stats(t)
    assert s.shape == (2,)
    assert s.dtype == "float8_e4m3fn"


def test_dtype_name() -> None:
    assert dtype_name(torch.float16) == "float16"
    assert dtype_name(torch.bfloat16) == "bfloat16"
    assert dtype_name(torch.float32) == "float32"
    assert dtype_name(torch.float64) == "float64"
    assert dtype_name(torch.int8) == "int8"
    assert dtype_name(torch.bool) == "bool"


# -- format_number ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (0.0, "0"),
        (-0.0, "0"),
        (1.0, "1"),
        (3.14159, "3.142"),
        (-0.5, "-0.5"),
        (0.001, "0.001"),
        (0.00099, "9.90e-04"),
        (1e-5, "1.00e-05"),
        (FP16_SMALLEST_NORMAL, "6.10e-05"),
        (9999.0, "9999"),
        (10000.0, "1.00e+04"),
        (65504.0, "6.55e+04"),
        (-70000.0, "-7.00e+04"),
        (1e300, "1.00e+300"),
        (INF, "inf"),
        (-INF, "-inf"),
        (NAN, "nan"),
    ],
)
def test_format_number(value: float, text: str) -> None:
    assert format_number(value) == text


def test_format_number_just_below_ten_thousand() -> None:
    assert format_number(9999.7) == "1.00e+04"


def test_zeros_are_exact_and_tiny_values_estimated_on_the_sample_beyond_exact_up_to() -> None:
    """Zeros are counted over every value (a flush or a divisor's 0 in a column the strided
    sample never visits still counts); tiny values up to ``EXACT_UP_TO`` values too, beyond that
    on the sample, scaled to the whole tensor. The batched queue and the eager path agree; a
    queue without ``exact_zeros`` estimates the zeros of a large FP16 tensor on the sample."""
    from nan_hunter.trace import deferred
    from nan_hunter.trace.stats import EXACT_UP_TO, SAMPLE, sample_size

    exact = torch.ones(EXACT_UP_TO)
    exact[1::3] = 0.0  # off any stride a sample would take
    exact[2::6] = 1e-6
    stats = tensor_stats(exact)
    n = exact.numel()
    assert (stats.zeros, stats.tiny) == (len(range(1, n, 3)), len(range(2, n, 6)))

    n = 16 * SAMPLE + 16  # step 16: the sample is every 16th value, 16385 of them
    assert n > EXACT_UP_TO and sample_size(n) == len(range(0, n, 16))
    big = torch.ones(n)
    big[1::8] = 0.0  # never sampled, all counted
    big[2::4] = 1e-6  # never sampled: no tiny value seen
    big[16::64] = -1e-6  # a quarter of the sample: scaled to the whole tensor
    big[32::64] = 0.0  # another quarter of the sample
    sampled = len(range(0, n, 16))
    for tensor in (big, big.half()):
        stats = tensor_stats(tensor)
        assert stats.zeros == len(range(1, n, 8)) + len(range(32, n, 64))
        assert stats.tiny == round(len(range(16, n, 64)) * n / sampled)
        queue = deferred.StatsQueue(FP16)
        assert queue.stats(queue.add(tensor, True)) == stats
        assert not queue.estimated_zeros
    rough = deferred.StatsQueue(FP16, exact_zeros=False)
    estimate = rough.stats(rough.add(big.half(), True))
    assert rough.estimated_zeros
    assert estimate.zeros == n - round((sampled - len(range(32, n, 64))) * n / sampled)
    assert estimate.tiny == stats.tiny and (estimate.min, estimate.max) == (stats.min, stats.max)
    small = deferred.StatsQueue(FP16, exact_zeros=False)
    small.stats(small.add(exact.half(), True))
    assert not small.estimated_zeros  # within EXACT_UP_TO: counted


def test_a_transposed_tensor_is_counted_in_memory_order_without_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transposed or permuted result (attention's heads) fills its storage once: its counts
    are taken over the storage in place, so they equal those of the contiguous tensor it views,
    estimate included, and nothing is copied. A slice with gaps is still flattened by a copy."""
    from nan_hunter.trace import deferred
    from nan_hunter.trace.stats import SAMPLE

    n = 16 * SAMPLE * 4
    base = torch.ones(n)
    base[16::64] = 1e-6  # a quarter of the memory-order sample: tiny
    base[5::7] = 0.0
    base = base.half().view(256, n // 256)
    permuted = base.t()
    assert not permuted.is_contiguous()

    def no_copy(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("reshaped: a copy")

    queue = deferred.StatsQueue(FP16)
    expected = queue.stats(queue.add(base, True))
    monkeypatch.setattr(torch.Tensor, "reshape", no_copy)
    seen = queue.stats(queue.add(permuted, True))
    assert (seen.zeros, seen.tiny, seen.min, seen.max) == (
        expected.zeros, expected.tiny, expected.min, expected.max,
    )
    assert seen.zeros == len(range(5, n, 7))
    monkeypatch.undo()
    gaps = base[:, ::2]
    assert queue.stats(queue.add(gaps, True)).zeros == int((gaps == 0).sum())


def test_extremes_of_a_transposed_tensor_are_taken_on_its_flat_storage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``aminmax`` of a transposed tensor runs 4x slower than on the same storage read flat: the
    queue and the gradient log reduce the flat view (same extremes); an expanded tensor, which
    has no such view, is reduced as it is."""
    from nan_hunter.precision.gradients import GradientLog
    from nan_hunter.trace import deferred, torch_originals

    seen: list[bool] = []
    real = torch.aminmax

    def watched(t: torch.Tensor, *args: object, **kwargs: object) -> object:
        seen.append(t.is_contiguous())
        return real(t, *args, **kwargs)  # type: ignore[arg-type]

    t = torch.randn(300, 200).t()
    expanded = torch.randn(1, 200).expand(300, 200)
    # the statistics call torch's own aminmax, taken at import (``trace.torch_originals``)
    monkeypatch.setattr(torch_originals, "aminmax", watched)
    queue = deferred.StatsQueue(FP16)
    stats = [queue.stats(queue.add(x, False)) for x in (t, expanded)]
    log = GradientLog(FP16)
    log.record(t, t.half())
    log.flush()
    monkeypatch.undo()
    assert seen == [True, False, True]
    assert (stats[0].min, stats[0].max) == (float(t.min()), float(t.max()))
    assert (stats[1].min, stats[1].max) == (float(expanded.min()), float(expanded.max()))
    assert log.max_abs == float(t.abs().max())
