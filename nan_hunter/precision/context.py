"""The precision a pass runs under, composed from the scan's settings.

- autocast, policy cuda: on a CPU, CPU autocast with CUDA's op lists and "cuda" aliased to the
  CPU; on a GPU, native autocast.
- autocast, policy cpu: on a CPU, CPU autocast; on a GPU, CUDA autocast with CPU's op lists.
- autocast, policy native: whatever ``torch.autocast`` does on the device.
- half: model and batch in FP16, no autocast.

On a CPU, FP16 arithmetic is emulated (FP32 kernels, results rounded to FP16) unless
``numerics: real`` asks for the real, ~100x slower, FP16 kernels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from nan_hunter.precision.device_alias import DeviceAlias
from nan_hunter.precision.emulation import LowPrecisionEmulation
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.gradients import GradientLog
from nan_hunter.precision.override import PolicyOverride
from nan_hunter.precision.policy import load_policy
from nan_hunter.trace import torch_originals as real


@dataclass(frozen=True)
class PrecisionPlan:
    mode: str
    """``autocast`` or ``half``."""
    policy: str
    """``cuda``, ``cpu`` or ``native``."""
    device: str
    """Where the scan runs: ``cpu`` or ``cuda``."""
    fmt: FloatFormat
    emulate: bool
    """Emulate low-precision arithmetic with FP32 kernels (CPU and FP16 only)."""

    @property
    def patch_device(self) -> str:
        """The ``device_type`` a fix should name: where the user's run happens."""
        return self.policy if self.policy in ("cuda", "cpu") else self.device

    @contextlib.contextmanager
    def low_precision(self) -> Iterator[None]:
        """Context for the forward and loss of the low-precision pass (not the backward)."""
        with contextlib.ExitStack() as stack:
            if self.mode == "autocast":
                if self.policy != "native" and self.policy != self.device:
                    stack.enter_context(
                        PolicyOverride(load_policy(self.policy), self.device, self.fmt.dtype)
                    )
                    if self.device == "cpu":
                        stack.enter_context(DeviceAlias("cuda", "cpu"))
                stack.enter_context(real.autocast(device_type=self.device, dtype=self.fmt.dtype))
            yield

    @contextlib.contextmanager
    def numerics(self, gradients: GradientLog | None = None) -> Iterator[None]:
        """Context for forward and backward: the FP16 emulation when it applies, logging what
        rounding does to gradients into ``gradients``."""
        if self.emulate:
            with LowPrecisionEmulation(self.fmt.dtype, gradients):
                yield
        else:
            yield
