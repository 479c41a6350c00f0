"""Triton RMSNorm and LayerNorm: launch configuration and the registered kernels.

Kernel signatures and semantics: :mod:`flashinfer.norm`. The @triton.jit code lives in
``_norm_kernels.py`` and is imported on first use (this module must import without Triton).

Layout: rows may be strided views; the last dim must have stride 1. A tensor whose last dim is
not unit-stride is copied to a contiguous buffer (and, when written, copied back), so any input
is accepted. Launch shape, chosen from the hidden size:

* ``hidden <= MAX_SINGLE_BLOCK``: one tile holds a whole row, read once. Short rows are packed
  several to a program (``ROW_TILE`` elements per program, e.g. 8 rows of a 128-wide QK-norm
  head) so that small heads still give each thread a 16-byte vector.
* longer rows: one program per row, walking it in ``LOOP_BLOCK``-wide chunks.
* ``num_warps``: about ``ELEMS_PER_THREAD`` fp32 values per thread, 1 to 16 warps (4096-wide
  rows get 16 warps, 8 elements per thread: one 16-byte load of bf16).
"""

from __future__ import annotations

import functools


import torch
from .launch import cdiv, device_of, fast, pow2


#: widest row (elements) handled by the single-pass kernel; wider rows loop over chunks.
MAX_SINGLE_BLOCK = 16384
#: chunk width of the looped kernel.
LOOP_BLOCK = 4096
#: elements per program when short rows are packed together.
ROW_TILE = 1024
#: target fp32 values per thread when choosing num_warps.
ELEMS_PER_THREAD = 8



@functools.lru_cache(maxsize=1024)
def launch_config(hidden: int, n_rows: int) -> tuple[int, int, bool, int]:
    """``(rows_per_program, block, single_pass, num_warps)`` for rows of ``hidden`` elements."""
    block = pow2(hidden)
    if block <= MAX_SINGLE_BLOCK:
        rows = max(1, min(ROW_TILE // block, pow2(n_rows)))
        single = True
    else:
        rows, block, single = 1, LOOP_BLOCK, False
    warps = min(16, max(1, pow2(rows * block // (32 * ELEMS_PER_THREAD))))
    return rows, block, single, warps



def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    """``t`` if its last dim has stride 1, else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()



def _stride(t: torch.Tensor, dim: int | None) -> int:
    """``t.stride(dim)``; 0 for ``dim=None`` (the absent head dim of a 2-D call)."""
    return 0 if dim is None else t.stride(dim)


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
            residual: torch.Tensor | None, eps: float, weight_bias: float) -> None:
    from . import _norm_kernels

    x = _unit_stride(input)
    y = _unit_stride(out)
    r = None if residual is None else _unit_stride(residual)
    if x.dim() == 2:
        (n_batch, hidden), n_inner = x.shape, 1
    else:
        n_batch, n_inner, hidden = x.shape
    n_rows = n_batch * n_inner
    rows, block, single, warps = launch_config(hidden, n_rows)
    res = x if r is None else r  # a placeholder pointer when there is no residual
    inner = 1 if x.dim() == 3 else None  # a 2-D [B, H] call: one row per batch entry
    with device_of(x):
        fast(_norm_kernels.rmsnorm_kernel)[(cdiv(n_rows, rows),)](
            x, weight.contiguous(), y, res,
            n_rows, n_inner, hidden,
            x.stride(0), _stride(x, inner), y.stride(0), _stride(y, inner), res.stride(0),
            _stride(res, inner),
            float(eps), float(weight_bias),
            HAS_RESIDUAL=r is not None, ROWS=rows, BLOCK=block, SINGLE_PASS=single,
            num_warps=warps,
        )
    if y is not out:
        out.copy_(y)
    if r is not None and r is not residual:
        residual.copy_(r)


def layernorm(input: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, out: torch.Tensor,
              eps: float) -> None:
    from . import _norm_kernels

    x = _unit_stride(input)
    y = _unit_stride(out)
    n_rows, hidden = x.shape
    rows, block, single, warps = launch_config(hidden, n_rows)
    with device_of(x):
        fast(_norm_kernels.layernorm_kernel)[(cdiv(n_rows, rows),)](
            x, gamma.contiguous(), beta.contiguous(), y,
            n_rows, hidden, x.stride(0), y.stride(0), float(eps),
            ROWS=rows, BLOCK=block, SINGLE_PASS=single, num_warps=warps,
        )
    if y is not out:
        out.copy_(y)
