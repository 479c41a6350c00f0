"""cuDNN adapter for the GEMM family: ``mm_bf16`` and ``bmm_fp8`` as cudnn-frontend matmul graphs.

What the graphs compute and how they are cached: :mod:`._gemm_graphs` (imports ``cudnn``,
imported here lazily, inside the kernels). Capability records: ``capability_db/cudnn.toml``.
Registered into the cudnn adapter's table (``backends/cudnn/__init__.py`` imports this module).
"""

from __future__ import annotations

import torch



def mm_bf16(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
            out: torch.Tensor) -> None:
    from . import _gemm_graphs

    _gemm_graphs.mm(a, b, bias, out)


def bmm_fp8(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
            out: torch.Tensor) -> None:
    from . import _gemm_graphs

    if A.dim() == 2:  # one product (mm_fp8)
        A, B, out = A[None], B[None], out[None]
    _gemm_graphs.bmm_fp8(A, B, A_scale, B_scale, out)
