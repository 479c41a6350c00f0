"""Triton backend: our own kernels. Triton is imported lazily, when a kernel first runs, because
the dispatcher imports this package while choosing, also on machines without Triton.

Each op family's registrations live in ``<family>.py`` (the @triton.jit kernels themselves sit
in ``_<family>_kernels.py`` modules that only the kernel functions import).
"""

from __future__ import annotations

from .. import KernelTable

KERNELS = KernelTable("triton")

from . import activation, norm, rope  # noqa: E402,F401  (fill KERNELS)
from . import batch_decode, page, sampling, softmax  # noqa: E402,F401
from . import gemm, gemm_grouped  # noqa: E402,F401
from . import moe  # noqa: E402,F401
