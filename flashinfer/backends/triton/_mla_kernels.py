"""@triton.jit kernel of the split-K MLA attention (imported on first use by mla.py).

:func:`mla_split_kernel`, grid ``(batch, row_tiles, num_splits)``: one program takes
``BLOCK_M`` query rows of one request (row ``r`` is query token ``r // NUM_HEADS`` and head ``r %
NUM_HEADS``: every head attends to the one latent cache), walks its share of the tokens those
rows can see through the page table (token ``j`` of request ``b`` is slot ``j % PAGE`` of page
``kv_indices[kv_indptr[b] + j // PAGE]``) and keeps an online softmax in fp32 on base-2 scores.
Each ``ckv`` tile is loaded once and serves both products: the scores ``q_nope @ ckv^T + q_pe
@ kpe^T`` and the output ``p @ ckv``.

Page ids are data: with ``CHECK_PAGES`` one outside ``[0, num_pages)`` is recorded in the
device's error record (the first bad entry of the program, rule ``page_code``) and its token is
skipped, so no load leaves the caches.

fp8 caches: a per-tensor ``ckv_scale`` is folded into the score scale and ``v_scale``, the
ratio ``kpe_scale / ckv_scale`` into ``q_pe`` (once, before the loop); per-token, per-128-channel
scales (``HAS_SCALE_ARR``) dequantise each ``ckv`` tile in registers.

Without ``SPLIT`` (one split) the program finishes its rows (``out`` in its dtype, ``lse`` base 2);
otherwise it writes the split's normalised partial output and base-2 lse to the fp32 scratch
``part_o [total_qo, H, S, D_CKV]`` / ``part_lse [total_qo, H, S]`` (``S = num_splits``) that the batch attention's
``decode_merge_kernel`` merges. Splits cut the keys each row tile can see into ``S`` chunks on
the device, from ``kv_lens`` and ``qo_indptr`` at launch (what a replayed CUDA graph needs).
"""

import triton
import triton.language as tl

from ._fault_kernels import report_faults


# the page count, the rows and the split count change with the batch: not specialised on, so one
# compile (and one kernel-pack entry) serves every batch
@triton.jit(do_not_specialize=["num_pages", "page_code", "rows_per_request", "num_splits"])
def mla_split_kernel(
    qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, scale_arr_ptr, part_o_ptr, part_lse_ptr, out_ptr, lse_ptr,
    err_ptr, qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_lens_ptr,
    stride_qnt, stride_qnh, stride_qpt, stride_qph,
    stride_cp, stride_ct, stride_kp, stride_kt, stride_sp, stride_st,
    stride_ot, stride_oh,
    qk_scale_log2, pe_ratio, v_scale, num_pages, page_code, rows_per_request, num_splits,
    NUM_HEADS: tl.constexpr, SPLIT: tl.constexpr, PAGE: tl.constexpr,
    D_CKV: tl.constexpr, D_KPE: tl.constexpr, BLOCK_CKV: tl.constexpr, BLOCK_KPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_PE_RATIO: tl.constexpr, HAS_SCALE_ARR: tl.constexpr,
    CHECK_PAGES: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_F32: tl.constexpr,
):
    b = tl.program_id(0)
    tile = tl.program_id(1)
    split = tl.program_id(2)

    q_start = tl.load(qo_indptr_ptr + b)
    q_len = tl.load(qo_indptr_ptr + b + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + b)
    page_base = tl.load(kv_indptr_ptr + b)

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = rows // NUM_HEADS
    head = rows % NUM_HEADS
    row_ok = (rows < rows_per_request) & (qi < q_len)
    token = (q_start + qi).to(tl.int64)
    pos = kv_len - q_len + qi  # each row's position (bottom-right causal)

    dc = tl.arange(0, BLOCK_CKV)
    qn = tl.load(qn_ptr + token[:, None] * stride_qnt + head[:, None] * stride_qnh + dc[None, :],
                 mask=row_ok[:, None] & (dc[None, :] < D_CKV), other=0.0)
    if DOT_F32:  # the interpreter's tl.dot mishandles bfloat16
        qn = qn.to(tl.float32)
    if D_KPE > 0:
        dp = tl.arange(0, BLOCK_KPE)
        qp = tl.load(qp_ptr + token[:, None] * stride_qpt + head[:, None] * stride_qph
                     + dp[None, :], mask=row_ok[:, None] & (dp[None, :] < D_KPE), other=0.0)
        if HAS_PE_RATIO:
            qp = qp.to(tl.float32) * pe_ratio
        qp = qp.to(qn.dtype)

    # the tokens this tile's rows can see, and this split's share of them
    first = (tile * BLOCK_M) // NUM_HEADS
    last = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // NUM_HEADS, q_len - 1)
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum(kv_len, kv_len - q_len + last + 1)
    span = tl.where(first < q_len, tl.maximum(hi, 0), 0)
    chunk = tl.cdiv(tl.cdiv(span, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, span)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_CKV], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        key_ok = keys < end
        entry = page_base + keys // PAGE
        page = tl.load(kv_indices_ptr + entry, mask=key_ok, other=0)
        if CHECK_PAGES:
            bad = key_ok & ((page < 0) | (page >= num_pages))
            n_bad = tl.sum(bad.to(tl.int32), 0)
            if n_bad > 0:
                first_bad = tl.min(tl.where(bad, entry, 2147483647), 0)
                value = tl.max(tl.where(bad & (entry == first_bad), page, -2147483647), 0)
                report_faults(err_ptr, page_code, first_bad, value, num_pages, n_bad)
            key_ok = key_ok & (bad == 0)
            page = tl.where(bad, 0, page)
        page = page.to(tl.int64)
        slot = (keys % PAGE).to(tl.int64)
        c_off = page * stride_cp + slot * stride_ct
        ckv = tl.load(ckv_ptr + c_off[:, None] + dc[None, :],
                      mask=key_ok[:, None] & (dc[None, :] < D_CKV), other=0.0)
        if HAS_SCALE_ARR:
            sc = tl.load(scale_arr_ptr + (page * stride_sp + slot * stride_st)[:, None]
                         + (dc // 128)[None, :], mask=key_ok[:, None] & (dc[None, :] < D_CKV),
                         other=0.0)
            ckv = ckv.to(tl.float32) * sc
        ckv = ckv.to(qn.dtype)
        s = tl.dot(qn, tl.trans(ckv))
        if D_KPE > 0:
            k_off = page * stride_kp + slot * stride_kt
            kpe = tl.load(kpe_ptr + k_off[:, None] + dp[None, :],
                          mask=key_ok[:, None] & (dp[None, :] < D_KPE), other=0.0)
            s = tl.dot(qp, tl.trans(kpe.to(qn.dtype)), s)
        s = s * qk_scale_log2
        visible = key_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            visible = visible & (keys[None, :] <= pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(qn.dtype), ckv)
        m_i = m_new

    seen = l_i > 0.0
    o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    if not SPLIT:  # the only split: finish the rows here
        tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dc[None, :],
                 (o * v_scale).to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (dc[None, :] < D_CKV))
        if WRITE_LSE:
            tl.store(lse_ptr + token * NUM_HEADS + head, lse, mask=row_ok)
    else:
        part_row = (token * NUM_HEADS + head) * num_splits + split
        tl.store(part_o_ptr + part_row[:, None] * D_CKV + dc[None, :], o,
                 mask=row_ok[:, None] & (dc[None, :] < D_CKV))
        tl.store(part_lse_ptr + part_row, lse, mask=row_ok)
