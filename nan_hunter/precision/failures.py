"""Errors by which CUDA autocast stops a model, recognised so a scan can report them."""

from __future__ import annotations

from dataclasses import dataclass

from nan_hunter.precision.override import AutocastPolicyError

_LOW_PRECISION_MESSAGES = (
    "Low precision dtypes not supported",  # linalg.inv, solve, cholesky, ... on Half/BFloat16
    "not implemented for 'Half'",
    "not implemented for 'BFloat16'",
)


@dataclass(frozen=True)
class PolicyFailure:
    kind: str
    """``"banned"``: refused under autocast; ``"unsupported_dtype"``: no FP16 kernel;
    ``"scalar_overflow"``: a Python constant (``-1e9``) does not fit the tensor's dtype."""
    message: str


def policy_failure(exc: RuntimeError) -> PolicyFailure | None:
    """A ``PolicyFailure`` when ``exc`` is one of the ways autocast or FP16 stops an op."""
    text = str(exc)
    if isinstance(exc, AutocastPolicyError) or "unsafe to autocast" in text:
        return PolicyFailure("banned", text.strip().splitlines()[0])
    if any(m in text for m in _LOW_PRECISION_MESSAGES):
        return PolicyFailure("unsupported_dtype", text.strip().splitlines()[0])
    if "cannot be converted to type" in text and "without overflow" in text:
        return PolicyFailure("scalar_overflow", text.strip().splitlines()[0])
    return None
