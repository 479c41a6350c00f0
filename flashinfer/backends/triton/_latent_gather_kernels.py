"""@triton.jit kernel that gathers a paged latent cache into contiguous pages of 64 tokens in
16 bits, dequantising as it goes (imported on first use by
:mod:`flashinfer.backends.shared.latent_gather`).

:func:`latent_gather_kernel`, grid ``(out_pages,)``: program ``p`` fills output page ``p`` (64
tokens x ``D_CKV + D_KPE``) with tokens ``first[p] .. first[p] + 63`` of request ``req[p]``:
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


# the page count, the capacity and the rule code change with the caches: one compile serves all
@triton.jit(do_not_specialize=["num_pages", "page_code", "capacity"])
def latent_gather_kernel(ckv_ptr, kpe_ptr, out_ptr, err_ptr, req_ptr, first_ptr, kv_indptr_ptr,
                         kv_indices_ptr, kv_lens_ptr, stride_cp, stride_ct, stride_kp, stride_kt,
                         ckv_scale, kpe_scale, num_pages, page_code, capacity,
                         PAGE: tl.constexpr, D_CKV: tl.constexpr, D_KPE: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_CKV: tl.constexpr,
                         BLOCK_KPE: tl.constexpr):
    p = tl.program_id(0)
    b = tl.load(req_ptr + p)
    rows = tl.arange(0, BLOCK_T)
    t = tl.load(first_ptr + p) + rows
    entry = tl.load(kv_indptr_ptr + b) + t // PAGE
    ok = (t < tl.load(kv_lens_ptr + b)) & (entry < capacity)
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
             mask=dc[None, :] < D_CKV)
    if D_KPE > 0:
        dp = tl.arange(0, BLOCK_KPE)
        y = tl.load(kpe_ptr + (page * stride_kp + slot * stride_kt)[:, None] + dp[None, :],
                    mask=ok[:, None] & (dp[None, :] < D_KPE), other=0.0)
        tl.store(out_ptr + out_row[:, None] + D_CKV + dp[None, :],
                 (y.to(tl.float32) * kpe_scale).to(out_ptr.dtype.element_ty),
                 mask=dp[None, :] < D_KPE)
