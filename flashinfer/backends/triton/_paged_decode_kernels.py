"""@triton.jit kernels of the split-K paged decode (imported on first use by batch_decode.py).

Phase 1, :func:`decode_split_kernel`, grid ``(batch, kv_heads * row_tiles, num_splits)``: one
program takes ``BLOCK_M`` query rows of one request that share one KV head (row ``r`` is query
token ``r // GROUP`` and query head ``kv_head * GROUP + r % GROUP``), walks its share of the
request's keys through the page table, and keeps an online softmax in fp32 on base-2 scores.
It writes the split's normalised partial output and its base-2 lse (``-inf`` when the split saw
no key) to fp32 scratch ``part_o [total_qo, H, S, D_vo]``, ``part_lse [total_qo, H, S]``.

Phase 2, :func:`decode_merge_kernel`, grid ``(total_qo, H)``: merges the ``S`` splits of one
(query token, head), adds the attention sink to the denominator, applies ``v_scale`` and writes
``out`` (its dtype) and ``lse`` (base 2, sink not included).

Each request's visible key range (``[kv_len - q_len - window_left, kv_len)`` clipped at 0, or all
keys without a window) is cut into ``S`` equal chunks, rounded up to ``BLOCK_N``, from the
device's ``kv_lens``: splits follow the lengths of the batch in the buffers at launch time, which
is what a replayed CUDA graph needs.

ALiBi (``HAS_ALIBI``) adds ``slope[head] * (key - query row in its request)`` to the scaled
score before the soft cap, as the attention contract says.

The products run on tensor cores in the query dtype (K/V, FP8 included, are converted to it);
``DOT_F32`` (CPU, Triton's interpreter) runs them in fp32 instead.
"""

import triton
import triton.language as tl


@triton.jit
def decode_split_kernel(
    q_ptr, k_ptr, v_ptr, part_o_ptr, part_lse_ptr,
    qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_lens_ptr,
    stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_vp, stride_vt, stride_vh,
    qk_scale_log2, soft_cap, soft_cap_log2,
    window_left, alibi_ptr,
    NUM_QO_HEADS: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, ROW_TILES: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PAGE: tl.constexpr,
    D_QK: tl.constexpr, D_VO: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DVO: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFT_CAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, DOT_F32: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // ROW_TILES
    tile = tl.program_id(1) % ROW_TILES
    split = tl.program_id(2)

    q_start = tl.load(qo_indptr_ptr + b)
    q_len = tl.load(qo_indptr_ptr + b + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + b)
    page_base = tl.load(kv_indptr_ptr + b)

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

    # this split's share of the request's visible keys
    lo = kv_len * 0
    if HAS_WINDOW:
        lo = tl.maximum(kv_len - q_len - window_left, 0)
    span = tl.maximum(kv_len - lo, 0)
    chunk = tl.cdiv(tl.cdiv(span, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, kv_len)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DVO], tl.float32)
    k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + kv_head.to(tl.int64) * stride_vh
    for n0 in range(start, end, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        key_ok = keys < end
        page = tl.load(kv_indices_ptr + page_base + keys // PAGE, mask=key_ok, other=0).to(tl.int64)
        slot = (keys % PAGE).to(tl.int64)
        k = tl.load(k_base + page[:, None] * stride_kp + slot[:, None] * stride_kt + dq[None, :],
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
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + page[:, None] * stride_vp + slot[:, None] * stride_vt + dv[None, :],
                    mask=key_ok[:, None] & (dv[None, :] < D_VO), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
        m_i = m_new

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
