"""Zeroing the rows a segmented library GEMM leaves undefined, without a host sync.

``torch._grouped_mm`` computes group 0 for the rows before ``indptr[0]`` and leaves the rows
from ``indptr[-1]`` on unwritten; the segment GEMM contract wants zeros there. The offsets stay
on the device (CUDA-graph safe), so the rows are found there: our Triton kernel
(``triton/_row_kernels.py``) touches only blocks that hold such rows; without Triton, a
masked fill (one pass over ``y``) does it.
"""

from __future__ import annotations

import contextlib
import functools

import torch

BLOCK_M, BLOCK_N = 64, 256


@functools.lru_cache(maxsize=1)
def _triton_kernel():
    try:
        from ..triton import _row_kernels
    except ImportError:  # no Triton: the masked fill below
        return None
    return _row_kernels.zero_rows_outside_kernel


def zero_rows_outside(y: torch.Tensor, indptr: torch.Tensor) -> None:
    """``y [M, N]`` (unit column stride) in place: rows outside ``[indptr[0], indptr[-1])``
    become 0. ``indptr [S + 1]`` int32/int64 on ``y``'s device."""
    m, n = y.shape
    if m == 0 or n == 0:
        return
    kernel = _triton_kernel() if (y.is_cuda or _interpreting()) and y.stride(1) == 1 else None
    if kernel is None:
        rows = torch.arange(m, device=y.device)
        y.masked_fill_(((rows < indptr[0]) | (rows >= indptr[-1])).unsqueeze(1), 0)
        return
    with torch.cuda.device(y.device) if y.is_cuda else contextlib.nullcontext():
        kernel[(-(-m // BLOCK_M),)](y, indptr, indptr.shape[0] - 1, m, n, y.stride(0),
                                    BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)


def _interpreting() -> bool:
    from ... import envs

    return bool(envs.TRITON_INTERPRET.get())

