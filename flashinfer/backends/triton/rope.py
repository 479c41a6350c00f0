"""Triton RoPE kernel registration and launch configuration (Triton imported on first run).

Signature and semantics: :mod:`flashinfer.rope` (module docstring); the @triton.jit kernel is in
``_rope_kernels.py``. One launch rotates q and k: grid ``(nnz, head blocks of q + of k)``.
Block sizes are a first guess, not measured yet: tiles of up to 1024 pairs, and smaller head
blocks when few tokens would leave most SMs idle (decode). A cache position outside the cache
is skipped by the kernel (the token is stored unrotated) and, when ``params.positions_fault``
is set, reported into the device's error record.
"""

from __future__ import annotations

import math

from ...index_checks import record
from .launch import cdiv, fast, pow2

_MAX_TILE_PAIRS = 1024
_MIN_PROGRAMS = 256  # about two programs per SM on an H100/H200




def _head_block(nnz: int, num_q_heads: int, num_k_heads: int, half_block: int) -> int:
    block = min(pow2(max(num_q_heads, num_k_heads)), max(1, _MAX_TILE_PAIRS // half_block))
    while block > 1 and nnz * (cdiv(num_q_heads, block) + cdiv(num_k_heads, block)) < _MIN_PROGRAMS:
        block //= 2
    return block


def rope(q, k, q_out, k_out, pos_ids, params, cos_sin_cache) -> None:
    from ._rope_kernels import rope_kernel

    nnz, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    if nnz == 0 or num_q_heads + num_k_heads == 0:
        return
    half = params.rotary_dim // 2
    half_block = pow2(half)
    block_h = _head_block(nnz, num_q_heads, num_k_heads, half_block)
    copy_pass = q_out is not q and params.rotary_dim < head_dim
    head_blocks = cdiv(num_q_heads, block_h) + cdiv(num_k_heads, block_h)
    smooth_a, smooth_b = (params.llama31.smooth_coefficients() if params.llama31 is not None
                          else (0.0, 0.0))
    cache = cos_sin_cache if cos_sin_cache is not None else pos_ids  # unused unless USE_CACHE
    cache_strides = cos_sin_cache.stride() if cos_sin_cache is not None else (0, 0)
    max_pos = cos_sin_cache.shape[0] if cos_sin_cache is not None else 0
    fault = params.positions_fault if cos_sin_cache is not None else None
    rec = record(q.device) if cos_sin_cache is not None else pos_ids  # unused without a cache
    fast(rope_kernel)[(nnz, head_blocks)](
        q, k, q_out, k_out, pos_ids, cache, rec, fault.code if fault is not None else 0,
        num_q_heads, num_k_heads, head_dim, half,
        *q.stride(), *k.stride(), *q_out.stride(), *k_out.stride(),
        *cache_strides, max_pos,
        float(params.rotary_dim), math.log2(params.rope_theta), 1.0 / params.rope_scale,
        smooth_a, smooth_b,
        INTERLEAVE=params.interleave, USE_CACHE=cos_sin_cache is not None,
        LLAMA31=params.llama31 is not None, COPY_PASS=copy_pass, BLOCK_H=block_h,
        HALF_BLOCK=half_block, PASS_BLOCK=pow2(head_dim - params.rotary_dim) if copy_pass else 1,
        num_warps=max(1, min(4, block_h * half_block // 128)),
    )
