"""@triton.jit kernels that gather a paged latent cache into contiguous pages of 64 tokens in
16 bits, dequantising as they go (imported on first use by
:mod:`flashinfer.backends.shared.latent_gather`).

:func:`gathered_table_kernel`, grid ``(batch,)``, the layout on the device (what a CUDA graph
replays): program ``b`` writes ``starts[b]`` = the output pages of the requests before ``b``
(``ceil(kv_len / 64)`` each; ``starts[batch]`` the total) and row ``b`` of ``table [batch,
width]``: ``starts[b] + j`` for its pages ``j`` (at most ``width``).

:func:`latent_gather_kernel`, grid ``(out_pages,)``: program ``p`` fills output page ``p`` (64
tokens x ``D_CKV + D_KPE``) with tokens ``first[p] .. first[p] + 63`` of request ``req[p]``
(host-made arrays), or with ``FROM_STARTS`` the request and first token that ``starts`` gives
page ``p`` (a program past ``starts[batch]`` writes nothing):
token ``t`` is slot ``t % PAGE`` of source page ``kv_indices[kv_indptr[b] + t // PAGE]``; its
latent is multiplied by ``ckv_scale``, its RoPE part by ``kpe_scale``, in fp32, then rounded
to the output dtype. Rows past the request's length are written as 0. A page id outside ``[0,
num_pages)`` is recorded in the device's error record (rule ``page_code``, the entry of
``kv_indices`` it came from) and its token written as 0; reads of ``kv_indices`` stay inside
its first ``capacity`` entries.
"""

import triton
import triton.language as tl

from ._fault_kernels import report_faults


@triton.jit(do_not_specialize=["batch", "width"])
def gathered_table_kernel(kv_lens_ptr, starts_ptr, table_ptr, batch, width,
                          OUT_PAGE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_W: tl.constexpr):
    b = tl.program_id(0)
    i = tl.arange(0, BLOCK_B)
    pages = (tl.load(kv_lens_ptr + i, mask=i < batch, other=0) + OUT_PAGE - 1) // OUT_PAGE
    start = tl.sum(tl.where(i < b, pages, 0), 0)
    mine = tl.minimum(tl.sum(tl.where(i == b, pages, 0), 0), width)
    tl.store(starts_ptr + b, start)
    if b == batch - 1:
        tl.store(starts_ptr + batch, tl.sum(pages, 0))
    row = table_ptr + b.to(tl.int64) * width
    for j0 in range(0, mine, BLOCK_W):
        j = j0 + tl.arange(0, BLOCK_W)
        tl.store(row + j, start + j, mask=j < mine)


# the page count, the capacity and the rule code change with the caches: one compile serves all
@triton.jit(do_not_specialize=["num_pages", "page_code", "capacity", "batch"])
def latent_gather_kernel(ckv_ptr, kpe_ptr, out_ptr, err_ptr, req_ptr, first_ptr, starts_ptr,
                         kv_indptr_ptr, kv_indices_ptr, kv_lens_ptr, stride_cp, stride_ct,
                         stride_kp, stride_kt, ckv_scale, kpe_scale, num_pages, page_code,
                         capacity, batch, PAGE: tl.constexpr, D_CKV: tl.constexpr,
                         D_KPE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_CKV: tl.constexpr,
                         BLOCK_KPE: tl.constexpr, FROM_STARTS: tl.constexpr,
                         BLOCK_B: tl.constexpr):
    p = tl.program_id(0)
    rows = tl.arange(0, BLOCK_T)
    if FROM_STARTS:  # the request whose pages hold p: how many requests end at or before it
        i = tl.arange(0, BLOCK_B)
        ends = tl.load(starts_ptr + 1 + i, mask=i < batch, other=2147483647)
        b = tl.sum((ends <= p).to(tl.int32), 0)
        live = rows < tl.where(b < batch, BLOCK_T, 0)  # (all rows, or none past the total)
        b = tl.minimum(b, batch - 1)
        first = (p - tl.load(starts_ptr + b)) * BLOCK_T
    else:
        b = tl.load(req_ptr + p)
        first = tl.load(first_ptr + p)
        live = rows < BLOCK_T
    t = first + rows
    entry = tl.load(kv_indptr_ptr + b) + t // PAGE
    ok = live & (t < tl.load(kv_lens_ptr + b)) & (entry < capacity)
    page = tl.load(kv_indices_ptr + entry, mask=ok, other=0)
    bad = ok & ((page < 0) | (page >= num_pages))
    n_bad = tl.sum(bad.to(tl.int32), 0)
    if n_bad > 0:
        first_bad = tl.min(tl.where(bad, entry, 2147483647), 0)
        value = tl.max(tl.where(bad & (entry == first_bad), page, -2147483647), 0)
        report_faults(err_ptr, page_code, first_bad, value, num_pages, n_bad)
    ok = ok & (bad == 0)
    page = tl.where(bad, 0, page).to(tl.int64)
    slot = (t % PAGE).to(tl.int64)
    out_row = (p.to(tl.int64) * BLOCK_T + rows) * (D_CKV + D_KPE)
    dc = tl.arange(0, BLOCK_CKV)
    x = tl.load(ckv_ptr + (page * stride_cp + slot * stride_ct)[:, None] + dc[None, :],
                mask=ok[:, None] & (dc[None, :] < D_CKV), other=0.0)
    tl.store(out_ptr + out_row[:, None] + dc[None, :],
             (x.to(tl.float32) * ckv_scale).to(out_ptr.dtype.element_ty),
             mask=live[:, None] & (dc[None, :] < D_CKV))
    if D_KPE > 0:
        dp = tl.arange(0, BLOCK_KPE)
        y = tl.load(kpe_ptr + (page * stride_kp + slot * stride_kt)[:, None] + dp[None, :],
                    mask=ok[:, None] & (dp[None, :] < D_KPE), other=0.0)
        tl.store(out_ptr + out_row[:, None] + D_CKV + dp[None, :],
                 (y.to(tl.float32) * kpe_scale).to(out_ptr.dtype.element_ty),
                 mask=live[:, None] & (dp[None, :] < D_KPE))
