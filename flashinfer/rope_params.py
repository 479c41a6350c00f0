"""What a ``rope`` kernel receives besides tensors (the kernel contract of
:mod:`flashinfer.rope`, which re-exports these; here so the attention family can rotate q and k
for ``pos_encoding_mode="ROPE_LLAMA"`` without importing the public module)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .index_checks import Fault


@dataclass(frozen=True)
class Llama31Factors:
    """Llama 3.1 frequency smoothing: ``high_freq_factor > low_freq_factor > 0``."""

    low_freq_factor: float
    high_freq_factor: float
    old_context_len: float

    def smooth_coefficients(self) -> tuple[float, float]:
        """``(a, b)`` with ``smooth = clamp(f_d * a + b, 0, 1)``."""
        a = self.old_context_len / (2 * math.pi * (self.high_freq_factor - self.low_freq_factor))
        b = -1.0 / (self.high_freq_factor / self.low_freq_factor - 1.0)
        return a, b


@dataclass(frozen=True)
class RopeParams:
    """Everything a kernel needs besides tensors; ``llama31=None`` means standard RoPE."""

    rotary_dim: int
    interleave: bool
    rope_scale: float = 1.0
    rope_theta: float = 1e4
    llama31: Llama31Factors | None = None
    #: cache variants: the fault under which a kernel reports a position outside the cache
    #: (``None``: the positions were checked on the host, nothing to report)
    positions_fault: Fault | None = None
