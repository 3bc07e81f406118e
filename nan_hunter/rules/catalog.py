"""Imports every rule module once, which registers its rule."""

from nan_hunter.rules import (  # noqa: F401
    nh001_bad_input,
    nh101_cast_overflow,
    nh102_matmul_overflow,
    nh103_statistics_overflow,
    nh104_mask_constant,
    nh105_transcendental,
    nh109_overflow,
    nh201_eps_underflow,
    nh202_flush_to_zero,
    nh301_fp32_too,
    nh302_banned_op,
    nh303_low_precision_linalg,
    nh401_backward_overflow,
    nh402_gradient_underflow,
    nh501_fp32_out_of_range,
    nh502_underflow_share,
    nh900_non_finite,
)
