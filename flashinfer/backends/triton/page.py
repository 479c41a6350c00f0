"""Triton append into a paged KV cache: launch configuration and the registered kernel.

Kernel signature and semantics: :mod:`flashinfer.page` (module docstring). The @triton.jit code
lives in ``_page_kernels.py`` and is imported on first use (this module must import without
Triton).

Every tensor is reinterpreted as the integer type of its element width before the launch, so
the kernel moves bits: any cache dtype (fp8 included, also on SMs without fp8 arithmetic) is
copied exactly. Launch grid: ``(nnz, cdiv(H_kv, BLOCK_H))``, a tile of about ``TILE`` elements
per program. Nothing is read back to the host: the kernel checks every index itself, skips a bad
token and reports it into the device's error record (:mod:`flashinfer.index_checks`).
"""

from __future__ import annotations

import contextlib

import torch

from ...attention import page_rules
from ...index_checks import record
from .launch import fast, pow2

#: elements of K (and as many of V) each program copies, at most (one head may exceed it).
TILE = 2048

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}



def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """A same-width integer view of ``t`` (no copy; strides unchanged)."""
    return t.view(_BITS[t.element_size()])


def _cache_strides(cache: torch.Tensor, kv_layout: str) -> tuple[int, int, int, int]:
    """(page, slot, head, dim) strides of a 4-D NHD ``[P, S, H, D]`` or HND ``[P, H, S, D]`` cache."""
    sp, s1, s2, sd = cache.stride()
    return (sp, s1, s2, sd) if kv_layout == "NHD" else (sp, s2, s1, sd)


def append_paged_kv(append_key: torch.Tensor, append_value: torch.Tensor,
                    batch_indices: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, kv_indices: torch.Tensor, kv_indptr: torch.Tensor,
                    page_size: int, kv_layout: str, skip_padding: bool = False) -> None:
    nnz, heads, head_dim = append_key.shape
    head_dim_v = append_value.shape[2]  # (MLA, 192 / 128: not K's)
    if nnz == 0:
        return
    from . import _page_kernels

    block_d, block_dv = pow2(head_dim), pow2(head_dim_v)
    block_h = min(pow2(heads), max(1, TILE // max(block_d, block_dv)))
    k, v = _as_bits(append_key), _as_bits(append_value)
    kc, vc = _as_bits(k_cache), _as_bits(v_cache)
    device = torch.cuda.device(kc.device) if kc.is_cuda else contextlib.nullcontext()
    with device:
        fast(_page_kernels.append_paged_kv_kernel)[(nnz, -(-heads // block_h))](
            k, v, batch_indices, positions, kc, vc, kv_indices, kv_indptr, record(kc.device),
            heads, head_dim, head_dim_v, page_size, kv_indptr.shape[0] - 1, kv_indices.shape[0],
            k_cache.shape[0],
            *k.stride(), *v.stride(),
            *_cache_strides(kc, kv_layout), *_cache_strides(vc, kv_layout),
            page_rules.APPEND_BATCH.code, page_rules.APPEND_INDPTR.code,
            page_rules.APPEND_POSITION.code, page_rules.APPEND_PAGE.code,
            BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_DV=block_dv, SKIP_PADDING=skip_padding,
            num_warps=4 if block_h * max(block_d, block_dv) >= 1024 else 1,
        )
