"""@triton.jit kernels of the split-K batch attention (imported on first use by
batch_attention.py): paged decode, paged prefill and ragged prefill.

Phase 1, :func:`attention_split_kernel`, grid ``(batch, kv_heads * row_tiles, num_splits)``: one
program takes ``BLOCK_M`` query rows of one request that share one KV head (row ``r`` is query
token ``r // GROUP`` and query head ``kv_head * GROUP + r % GROUP``), walks its share of the keys
those rows can see, and keeps an online softmax in fp32 on base-2 scores. Keys are read through
the page table (``PAGE`` > 0: key ``j`` of request ``b`` is slot ``j % PAGE`` of page
``kv_indices[kv_indptr[b] + j // PAGE]``) or, for the ragged op (``PAGE == 0``), from row
``kv_indptr[b] + j`` of ``k`` / ``v``.

With ``NUM_SPLITS == 1`` the program finishes the rows itself (attention sink in the
denominator, ``v_scale``, ``out`` in its dtype, ``lse`` base 2 without the sink): one launch.
Otherwise it writes the split's normalised partial output and its base-2 lse (``-inf`` when the
split saw no key) to fp32 scratch ``part_o [total_qo, H, S, D_vo]``, ``part_lse [total_qo, H,
S]``, and phase 2, :func:`decode_merge_kernel`, grid ``(total_qo, H)``, merges the ``S`` splits of
one (query token, head) and finishes them the same way.

The keys a tile's rows can see — ``[first row's position - window_left, last row's position]``
with causal and a window, clipped to ``[0, kv_len)``; query row ``i`` of ``q_len`` sits at
position ``kv_len - q_len + i`` — are cut into ``S`` equal chunks, rounded up to ``BLOCK_N``,
from the device's ``kv_lens`` and ``qo_indptr``: splits follow the lengths of the batch in the
buffers at launch time, which is what a replayed CUDA graph needs. A tile past its request's
rows sees no key.

ALiBi (``HAS_ALIBI``) adds ``slope[head] * (key - query row in its request)`` to the scaled
score before the soft cap, as the attention contract says. A custom mask (``HAS_MASK``,
prefill) is the request's ``q_len x kv_len`` row-major block of bytes at ``mask_indptr[b]``
(nonzero = keep); it replaces causal.

The products run on tensor cores in the query dtype (K/V, FP8 included, are converted to it);
``DOT_F32`` (CPU, Triton's interpreter) runs them in fp32 instead.
"""

import triton
import triton.language as tl


@triton.jit
def _finish(acc, m_i, l_i, head, sinks_ptr, v_scale, HAS_SINKS: tl.constexpr):
    """``(out, lse)`` of rows with running max ``m_i`` (base 2), sum ``l_i`` and unnormalised
    output ``acc``: the sink (natural-log logit) joins the denominator only; a row that saw no
    key gets 0 and ``-inf``."""
    seen = l_i > 0.0
    m_safe = tl.where(seen, m_i, 0.0)
    denom = l_i
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        denom = denom + tl.exp2(sink - m_safe)
    o = tl.where(seen[:, None], acc / tl.where(seen, denom, 1.0)[:, None], 0.0) * v_scale
    lse = tl.where(seen, m_safe + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    return o, lse


@triton.jit
def attention_split_kernel(
    q_ptr, k_ptr, v_ptr, part_o_ptr, part_lse_ptr, out_ptr, lse_ptr, sinks_ptr,
    qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_lens_ptr, mask_ptr, mask_indptr_ptr,
    alibi_ptr,
    stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_vp, stride_vt, stride_vh,
    stride_ot, stride_oh,
    qk_scale_log2, soft_cap, soft_cap_log2, window_left, v_scale,
    NUM_QO_HEADS: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, ROW_TILES: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PAGE: tl.constexpr,
    D_QK: tl.constexpr, D_VO: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DVO: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFT_CAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_MASK: tl.constexpr, HAS_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr, DOT_F32: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // ROW_TILES
    tile = tl.program_id(1) % ROW_TILES
    split = tl.program_id(2)

    q_start = tl.load(qo_indptr_ptr + b)
    q_len = tl.load(qo_indptr_ptr + b + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + b)
    kv_base = tl.load(kv_indptr_ptr + b)  # first page-table entry (paged) or K/V row (ragged)

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < ROWS) & (qi < q_len)
    token = (q_start + qi).to(tl.int64)
    pos = kv_len - q_len + qi  # absolute position of each query row

    dq = tl.arange(0, BLOCK_DQK)
    dv = tl.arange(0, BLOCK_DVO)
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dq[None, :],
                mask=row_ok[:, None] & (dq[None, :] < D_QK), other=0.0)
    if DOT_F32:  # the interpreter's tl.dot mishandles bfloat16
        q = q.to(tl.float32)
    if HAS_ALIBI:  # bias slope[head] * (key - row in the request), natural-log units
        slope = tl.load(alibi_ptr + head, mask=row_ok, other=0.0)
    if HAS_MASK:
        mask_row = tl.load(mask_indptr_ptr + b).to(tl.int64) + qi.to(tl.int64) * kv_len

    # the keys this tile's rows can see, and this split's share of them
    first = (tile * BLOCK_M) // GROUP
    last = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // GROUP, q_len - 1)
    lo = kv_len * 0
    if HAS_WINDOW:
        lo = tl.maximum(kv_len - q_len + first - window_left, 0)
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum(kv_len, kv_len - q_len + last + 1)
    hi = tl.where(first < q_len, hi, lo)  # a tile past the request's rows
    span = tl.maximum(hi - lo, 0)
    chunk = tl.cdiv(tl.cdiv(span, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, lo + span)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DVO], tl.float32)
    k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + kv_head.to(tl.int64) * stride_vh
    for n0 in range(start, end, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        key_ok = keys < end
        if PAGE == 0:
            k_off = (kv_base + keys).to(tl.int64) * stride_kt
            v_off = (kv_base + keys).to(tl.int64) * stride_vt
        else:
            page = tl.load(kv_indices_ptr + kv_base + keys // PAGE, mask=key_ok,
                           other=0).to(tl.int64)
            slot = (keys % PAGE).to(tl.int64)
            k_off = page * stride_kp + slot * stride_kt
            v_off = page * stride_vp + slot * stride_vt
        k = tl.load(k_base + k_off[:, None] + dq[None, :],
                    mask=key_ok[:, None] & (dq[None, :] < D_QK), other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
        if HAS_ALIBI:
            bias = slope[:, None] * (keys[None, :] - qi[:, None]).to(tl.float32)
        if HAS_SOFT_CAP:
            # cap * tanh(x / cap) on base-2 scores: tanh(y) = 1 - 2 / (exp(2y) + 1)
            x = s * (qk_scale_log2 / soft_cap_log2)
            if HAS_ALIBI:  # the bias goes in before the cap
                x = x + bias / soft_cap
            t = 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)
            s = soft_cap_log2 * t
        else:
            s = s * qk_scale_log2
            if HAS_ALIBI:
                s = s + bias * 1.4426950408889634  # log2(e)
        visible = key_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            visible = visible & (keys[None, :] <= pos[:, None])
        if HAS_WINDOW:
            visible = visible & (keys[None, :] >= pos[:, None] - window_left)
        if HAS_MASK:
            keep = tl.load(mask_ptr + mask_row[:, None] + keys[None, :], mask=visible, other=0)
            visible = visible & (keep != 0)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + v_off[:, None] + dv[None, :],
                    mask=key_ok[:, None] & (dv[None, :] < D_VO), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
        m_i = m_new

    if NUM_SPLITS == 1:  # the only split: finish the rows here
        o, lse = _finish(acc, m_i, l_i, head, sinks_ptr, v_scale, HAS_SINKS)
        tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (dv[None, :] < D_VO))
        if WRITE_LSE:
            tl.store(lse_ptr + token * NUM_QO_HEADS + head, lse, mask=row_ok)
    else:
        seen = l_i > 0.0
        o = acc / tl.where(seen, l_i, 1.0)[:, None]
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        part_row = (token * NUM_QO_HEADS + head) * NUM_SPLITS + split
        tl.store(part_o_ptr + part_row[:, None] * D_VO + dv[None, :], o,
                 mask=row_ok[:, None] & (dv[None, :] < D_VO))
        tl.store(part_lse_ptr + part_row, lse, mask=row_ok)


@triton.jit
def decode_merge_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, lse_ptr, sinks_ptr,
    stride_ot, stride_oh, v_scale,
    NUM_QO_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    D_VO: tl.constexpr, BLOCK_DVO: tl.constexpr,
    HAS_SINKS: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row = token * NUM_QO_HEADS + head
    s = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DVO)
    lse_s = tl.load(part_lse_ptr + row * NUM_SPLITS + s, mask=s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse_s - m_safe)
    denom = tl.sum(w, 0)
    o_s = tl.load(part_o_ptr + (row * NUM_SPLITS + s)[:, None] * D_VO + dv[None, :],
                  mask=(s[:, None] < NUM_SPLITS) & (dv[None, :] < D_VO), other=0.0)
    num = tl.sum(o_s * w[:, None], 0)
    total = denom
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        total = total + tl.exp2(sink - m_safe)
    o = tl.where(denom > 0.0, num / tl.where(denom > 0.0, total, 1.0), 0.0) * v_scale
    tl.store(out_ptr + token * stride_ot + head * stride_oh + dv, o.to(out_ptr.dtype.element_ty),
             mask=dv < D_VO)
    if WRITE_LSE:
        lse = tl.where(denom > 0.0, m_safe + tl.log2(tl.where(denom > 0.0, denom, 1.0)),
                       float("-inf"))
        tl.store(lse_ptr + row, lse)
