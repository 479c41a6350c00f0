"""Reference backend: pure PyTorch, float32 accumulation, CPU and GPU; the test oracle.

Each op family lives in its own module; importing them fills ``KERNELS``.
"""

from __future__ import annotations

from .. import KernelTable

KERNELS = KernelTable("reference")

from . import activation, attention, norm, rope  # noqa: E402,F401  (fill KERNELS)
from . import batch_attention, gemm, gemm_grouped, page, sampling  # noqa: E402,F401
from . import moe  # noqa: E402,F401
