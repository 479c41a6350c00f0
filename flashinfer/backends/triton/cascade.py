"""Triton state merging: the launchers of ``_cascade_kernels.py`` (imported on first use, so this
module imports without Triton). Kernel signatures and semantics: :mod:`flashinfer.attention.merge`.

One program per row and :func:`_tile` heads (about :data:`TILE` values a program); the head dim
is walked in chunks of at most :data:`MAX_BLOCK_D` (any strides, any head count: nothing like a
thread-block limit applies).
"""

from __future__ import annotations

import torch

from .launch import device_of, fast, pow2

#: widest head-dim chunk one program holds
MAX_BLOCK_D = 512
#: values one program holds per chunk (heads x head-dim chunk)
TILE = 4096


def _tile(heads: int, head_dim: int) -> tuple[int, int]:
    """``(BLOCK_H, BLOCK_D)`` of a program: the head dim chunk, then as many heads as fill
    :data:`TILE`."""
    block_d = min(MAX_BLOCK_D, max(16, pow2(head_dim)))
    return max(1, min(pow2(heads), TILE // block_d)), block_d


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                v_out: torch.Tensor, s_out: torch.Tensor, mask: torch.Tensor | None) -> None:
    from . import _cascade_kernels as K

    rows, heads, head_dim = v_a.shape
    if rows == 0 or heads == 0:
        return
    block_h, block_d = _tile(heads, head_dim)
    with device_of(v_a):
        fast(K.merge_two_kernel)[(rows, -(-heads // block_h))](
            v_a, s_a, v_b, s_b, v_out, s_out, v_a if mask is None else mask,
            *v_a.stride(), *v_b.stride(), *v_out.stride(),
            *s_a.stride(), *s_b.stride(), *s_out.stride(), heads, head_dim,
            HAS_MASK=mask is not None, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4,
        )


def merge_states(v: torch.Tensor, s: torch.Tensor, indptr: torch.Tensor | None,
                 v_out: torch.Tensor, s_out: torch.Tensor) -> None:
    from . import _cascade_kernels as K

    rows, heads, head_dim = v_out.shape
    if rows == 0 or heads == 0:
        return
    if indptr is None:  # v [rows, n, H, D]
        num_states = v.shape[1]
        v_strides, s_strides = v.stride(), s.stride()
    else:  # v [total, H, D], the rows' states from indptr
        num_states = 0
        v_strides, s_strides = (0,) + v.stride(), (0,) + s.stride()
    block_h, block_d = _tile(heads, head_dim)
    with device_of(v):
        fast(K.merge_many_kernel)[(rows, -(-heads // block_h))](
            v, s, v if indptr is None else indptr, v_out, s_out, num_states,
            *v_strides, *s_strides, *v_out.stride(), *s_out.stride(), heads, head_dim,
            HAS_INDPTR=indptr is not None, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4,
        )


__all__ = ["merge_state", "merge_states"]
