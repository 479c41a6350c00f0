"""@triton.jit kernel for appending tokens to a paged KV cache (imported only when it runs).

One program per (token, block of ``BLOCK_H`` heads): it reads the token's request and position,
looks up its page ``kv_indices[kv_indptr[b] + pos // page_size]`` and slot ``pos % page_size``,
and copies a ``[BLOCK_H, BLOCK_D]`` tile of K and a ``[BLOCK_H, BLOCK_DV]`` one of V (K and V
may differ in head dim: MLA's latent and RoPE parts, DeepSeek's 192 / 128). The cache strides (page, slot, head,
dim) come from the launcher, so one kernel serves NHD and HND. The tensors arrive as same-width
integer views (``page.py``), so the copy is bit exact for any dtype, fp8 included, on any SM.
Offsets are int64, so any cache size is addressable.

Every index is checked before it is dereferenced, by the rules of
``flashinfer.attention.page_rules.append_checks``: a token that breaks one copies nothing, and the
program of its first head block reports the fault into the error record (``_fault_kernels``).
With ``SKIP_PADDING`` a negative request index is a padding token: nothing copied, no fault.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._fault_kernels import report_fault


@triton.jit
def append_paged_kv_kernel(
    k_ptr, v_ptr, batch_ptr, pos_ptr, k_cache_ptr, v_cache_ptr, indices_ptr, indptr_ptr, rec_ptr,
    num_heads, head_dim, head_dim_v, page_size, batch_size, num_ids, num_pages,
    k_st, k_sh, k_sd, v_st, v_sh, v_sd,
    kc_sp, kc_ss, kc_sh, kc_sd, vc_sp, vc_ss, vc_sh, vc_sd,
    BAD_BATCH, BAD_INDPTR, BAD_POSITION, BAD_PAGE,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    SKIP_PADDING: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    reporter = tl.program_id(1) == 0
    b = tl.load(batch_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    b_ok = (b >= 0) & (b < batch_size)
    fault = b_ok == 0
    if SKIP_PADDING:  # a negative request index marks a padding token: skipped, no fault
        fault = fault & (b >= 0)
    if reporter & fault:
        report_fault(rec_ptr, BAD_BATCH, t, b, batch_size)
    bs = tl.where(b_ok, b, 0)
    start = tl.load(indptr_ptr + bs, mask=b_ok, other=0).to(tl.int64)
    end = tl.load(indptr_ptr + bs + 1, mask=b_ok, other=0).to(tl.int64)
    s_bad = b_ok & ((start < 0) | (start > num_ids))
    e_bad = b_ok & (s_bad == 0) & ((end < start) | (end > num_ids))
    if reporter & (s_bad | e_bad):
        report_fault(rec_ptr, BAD_INDPTR, tl.where(s_bad, bs, bs + 1), tl.where(s_bad, start, end),
                     num_ids)
    ok = b_ok & (s_bad == 0) & (e_bad == 0)
    slots = tl.where(ok, end - start, 0) * page_size
    p_bad = ok & ((pos < 0) | (pos >= slots))
    if reporter & p_bad:
        report_fault(rec_ptr, BAD_POSITION, t, pos, slots)
    ok = ok & (p_bad == 0)
    j = tl.where(ok, start + pos // page_size, 0)
    page = tl.load(indices_ptr + j, mask=ok, other=0).to(tl.int64)
    g_bad = ok & ((page < 0) | (page >= num_pages))
    if reporter & g_bad:
        report_fault(rec_ptr, BAD_PAGE, j, page, num_pages)
    ok = ok & (g_bad == 0)
    slot = tl.where(ok, pos % page_size, 0)
    page = tl.where(ok, page, 0)

    heads = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    head_ok = heads < tl.where(ok, num_heads, 0)
    dims = tl.arange(0, BLOCK_D)[None, :].to(tl.int64)
    mask = head_ok & (dims < head_dim)
    k = tl.load(k_ptr + t * k_st + heads * k_sh + dims * k_sd, mask=mask)
    tl.store(k_cache_ptr + page * kc_sp + slot * kc_ss + heads * kc_sh + dims * kc_sd, k, mask=mask)
    dims = tl.arange(0, BLOCK_DV)[None, :].to(tl.int64)
    mask = head_ok & (dims < head_dim_v)
    v = tl.load(v_ptr + t * v_st + heads * v_sh + dims * v_sd, mask=mask)
    tl.store(v_cache_ptr + page * vc_sp + slot * vc_ss + heads * vc_sh + dims * vc_sd, v, mask=mask)
