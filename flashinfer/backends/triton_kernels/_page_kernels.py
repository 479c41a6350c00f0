"""@triton.jit kernel for appending tokens to a paged KV cache (imported only when it runs).

One program per (token, block of ``BLOCK_H`` heads): it reads the token's request and position,
looks up its page ``kv_indices[kv_indptr[b] + pos // page_size]`` and slot ``pos % page_size``,
and copies a ``[BLOCK_H, BLOCK_D]`` tile of K and of V. The cache strides (page, slot, head,
dim) come from the launcher, so one kernel serves NHD and HND. The tensors arrive as same-width
integer views (``page.py``), so the copy is bit exact for any dtype, fp8 included, on any SM.
Offsets are int64, so any cache size is addressable.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def append_paged_kv_kernel(
    k_ptr, v_ptr, batch_ptr, pos_ptr, k_cache_ptr, v_cache_ptr, indices_ptr, indptr_ptr,
    num_heads, head_dim, page_size,
    k_st, k_sh, k_sd, v_st, v_sh, v_sd,
    kc_sp, kc_ss, kc_sh, kc_sd, vc_sp, vc_ss, vc_sh, vc_sd,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    b = tl.load(batch_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    start = tl.load(indptr_ptr + b).to(tl.int64)
    page = tl.load(indices_ptr + start + pos // page_size).to(tl.int64)
    slot = pos % page_size

    heads = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :].to(tl.int64)
    mask = (heads < num_heads) & (dims < head_dim)

    k = tl.load(k_ptr + t * k_st + heads * k_sh + dims * k_sd, mask=mask)
    tl.store(k_cache_ptr + page * kc_sp + slot * kc_ss + heads * kc_sh + dims * kc_sd, k, mask=mask)
    v = tl.load(v_ptr + t * v_st + heads * v_sh + dims * v_sd, mask=mask)
    tl.store(v_cache_ptr + page * vc_sp + slot * vc_ss + heads * vc_sh + dims * vc_sd, v, mask=mask)
