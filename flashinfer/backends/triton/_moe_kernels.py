"""@triton.jit kernels of the Triton fused MoE (launched by ``moe.py``).

Both GEMMs walk the expert-sorted, block-padded row list built by ``moe.align``: row ``r`` of
the padded list holds a flat (token, slot) pair index ``p = token * TOP_K + slot``, or the
sentinel ``NUM_PAIRS`` in padding. M-block ``b`` (rows ``[b * BLOCK_M, (b + 1) * BLOCK_M)``)
belongs to one local expert, ``block_expert[b]``; the grid is launched for the largest possible
number of blocks and blocks at or past ``num_blocks[0]`` (a device scalar) return at once.

* ``align_kernel`` (program 0): builds that list, a counting sort of the pair indices by
  local expert (stable: ascending within an expert), each expert's segment padded to a multiple
  of ``BLOCK_M``, the expert of every block and the number of used blocks (ids that are not
  local experts are left out: other ranks' by design; with ``CHECK_IDS``, ids outside
  ``[0, TOTAL)``, which no rank owns, are reported into the error record under ``CODE``,
  ``_report_ids``); for more pairs the same list comes from ``align_count_kernel``
  (per-chunk counts, one program per chunk), ``align_offsets_kernel`` (one program: segment
  starts, blocks, the padding fill) and ``align_scatter_kernel`` (one program per chunk).
  Under W8A8 with a half-precision input the programs past those of ``align_kernel`` /
  ``align_count_kernel`` quantise it (``_quantise_tile``), saving a launch;
* ``gemm1_kernel``: ``inter[r, n] = act(x[p // TOP_K] @ w1[e, I + n]) * (x[p // TOP_K] @
  w1[e, n])`` for ``n`` in the program's column tile (up ``[:I]``, gate ``[I:]``, two
  accumulators), written in the activation dtype (W8A8: fp8 with 1x128 scales);
* ``gemm2_kernel``: ``result[p, m] = weight[p] * (inter[r] @ w2[e, m])``, one row per (token,
  slot) pair, in the output dtype when that is half precision (float32 otherwise);
* ``finalize_kernel``: ``out[t] = sum of result[t * TOP_K + s]`` over the local slots, in slot
  order in float32 (deterministic, no atomics, no zero-filled buffer).

Both GEMMs run on a 1-D grid ordered by ``_tile_of`` (groups of M-blocks across the column
tiles), so an M-block's input rows are read from memory once, not once per column tile.

FP8 128x128 block-scaled experts (``QUANT = 1``) run W8A8, DeepSeek-V3's recipe (and what
upstream's CUTLASS MoE does): the input arrives in fp8 with 1x128 scales, or
``_quantise_tile`` quantises it once per token and 128-wide group (``scale = amax /
448``, per row); gemm1's epilogue quantises its ``BLOCK_M x 128`` intermediate tile (one scale
group) the same way and writes it in fp8 with its scales, which gemm2 reads as they are.
``tl.dot`` multiplies fp8 by fp8; the product is scaled by ``a_scale[row] * w_scale[column
block]``. So the input and the intermediate carry fp8 rounding (about 2**-4 relative per
element) on top of the weights'. Per-tensor fp8 weights
(``QUANT = 2``) are converted to the activation dtype as they are loaded and their scales applied
to the finished accumulators. ``DOT_F32`` (CPU, Triton's interpreter) runs the products in
float32 on the same (quantised) values.
"""

import triton
import triton.language as tl

from ._fault_kernels import report_fault


@triton.jit
def _activation(gate, ACTIVATION: tl.constexpr):
    """3 Swiglu: SiLU; 4 Geglu: erf GELU; 8 GegluTanh: tanh GELU (float32 in and out)."""
    if ACTIVATION == 3:
        act = gate * tl.sigmoid(gate)
    elif ACTIVATION == 4:
        act = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476))
    else:  # 0.5 * (1 + tanh(z)) == sigmoid(2 z), z = sqrt(2/pi) * (g + 0.044715 g^3)
        z2 = 1.5957691216057308 * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(z2)
    return act


@triton.jit
def _local_key(raw, inside, OFFSET, NUM_EXPERTS: tl.constexpr, EP: tl.constexpr):
    """Local expert of global ids ``raw``; ``EP`` (no expert) for other ranks, ids no rank owns
    and lanes past the end (``inside`` False)."""
    key = raw - OFFSET
    return tl.where(inside & (key >= 0) & (key < NUM_EXPERTS), key, EP)


@triton.jit
def _local_experts(ids_ptr, i, NUM_PAIRS, OFFSET, NUM_EXPERTS: tl.constexpr, EP: tl.constexpr):
    """Local expert of pairs ``i``; ``EP`` (no expert) for other ranks and past the end."""
    inside = i < NUM_PAIRS
    raw = tl.load(ids_ptr + i, mask=inside, other=0).to(tl.int32)
    return _local_key(raw, inside, OFFSET, NUM_EXPERTS, EP)


@triton.jit
def _report_ids(ids_ptr, rec_ptr, CODE, TOTAL, first, count):
    """``count`` pairs had an id outside ``[0, TOTAL)``, the lowest being pair ``first``: into
    the error record (``report_fault`` counts one; the rest is added to the record's count,
    element 3 of ``[code, key, bound, count]``)."""
    if count > 0:
        report_fault(rec_ptr, CODE, first, tl.load(ids_ptr + first), TOTAL)
        tl.atomic_add(rec_ptr + 3, (count - 1).to(tl.int64))


# the pair count changes every call: not specialised on its value (nor the fault's code and
# bound, which may be 1)
@triton.jit(do_not_specialize=["NUM_PAIRS", "OFFSET", "ROWS", "TOKENS", "TOTAL", "CODE"])
def align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, num_blocks_ptr, NUM_PAIRS, OFFSET, ROWS,
                 x_ptr, q_ptr, s_ptr, TOKENS, HIDDEN, stride_x, stride_q, stride_st, stride_sk,
                 rec_ptr, TOTAL, CODE,
                 NUM_EXPERTS: tl.constexpr, EP: tl.constexpr, BLOCK_M: tl.constexpr,
                 CHUNK: tl.constexpr, QUANTISE: tl.constexpr, BLOCK_T: tl.constexpr,
                 DOT_F32: tl.constexpr, CHECK_IDS: tl.constexpr):
    """``ids [NUM_PAIRS]`` global expert ids -> ``sorted [ROWS]`` (pair indices by local expert,
    each expert's run starting on a multiple of BLOCK_M, padding ``NUM_PAIRS``), ``block_expert
    [ROWS / BLOCK_M]`` and ``num_blocks [1]``. Program 0; ``EP`` = NUM_EXPERTS rounded up to a
    power of two. Ranks inside a chunk come from a cumulative sum over a one-hot [CHUNK, EP].
    ``QUANTISE``: programs 1, 2, ... quantise the input's tiles (``_quantise_tile``).
    ``CHECK_IDS``: the counting pass also finds the ids outside ``[0, TOTAL)`` and reports the
    first (``_report_ids``)."""
    if QUANTISE:
        if tl.program_id(0) > 0:
            _quantise_tile(x_ptr, q_ptr, s_ptr, tl.program_id(0) - 1, TOKENS, HIDDEN, stride_x,
                           stride_q, stride_st, stride_sk, BLOCK_T, DOT_F32)
            return
    e = tl.arange(0, EP)
    lane = tl.arange(0, CHUNK)
    counts = tl.zeros([EP], tl.int32)
    bad_at = tl.zeros([CHUNK], tl.int32) + NUM_PAIRS  # CHECK_IDS: lowest bad pair per lane
    bad_n = tl.zeros([CHUNK], tl.int32)
    for start in range(0, NUM_PAIRS, CHUNK):
        i = start + lane
        inside = i < NUM_PAIRS
        raw = tl.load(ids_ptr + i, mask=inside, other=0).to(tl.int32)
        key = _local_key(raw, inside, OFFSET, NUM_EXPERTS, EP)
        counts += tl.sum((key[:, None] == e[None, :]).to(tl.int32), axis=0)
        if CHECK_IDS:
            bad = inside & ((raw < 0) | (raw >= TOTAL))
            bad_at = tl.minimum(bad_at, tl.where(bad, i, NUM_PAIRS))
            bad_n += bad.to(tl.int32)
    if CHECK_IDS:
        _report_ids(ids_ptr, rec_ptr, CODE, TOTAL, tl.min(bad_at, axis=0), tl.sum(bad_n, axis=0))
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    first = end - padded
    tl.store(num_blocks_ptr, tl.sum(padded, axis=0) // BLOCK_M)
    for b0 in range(0, ROWS // BLOCK_M, CHUNK):
        b = b0 + lane
        before = tl.sum((end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.minimum(before, NUM_EXPERTS - 1),
                 mask=b < ROWS // BLOCK_M)
    for r0 in range(0, ROWS, CHUNK):
        r = r0 + lane
        tl.store(sorted_ptr + r, tl.zeros([CHUNK], tl.int32) + NUM_PAIRS, mask=r < ROWS)
    tl.debug_barrier()  # the padding fill lands before the pairs overwrite it
    seen = tl.zeros([EP], tl.int32)
    for start in range(0, NUM_PAIRS, CHUNK):
        i = start + lane
        key = _local_experts(ids_ptr, i, NUM_PAIRS, OFFSET, NUM_EXPERTS, EP)
        onehot = (key[:, None] == e[None, :]).to(tl.int32)
        rank = tl.cumsum(onehot, axis=0)  # inclusive rank of each pair within its expert
        pos = tl.sum(onehot * ((first + seen)[None, :] + rank - 1), axis=1)
        tl.store(sorted_ptr + pos, i, mask=key < EP)
        seen += tl.sum(onehot, axis=0)


# Many chunks: three launches instead of one program walking every pair twice (0.6 ms for 8,192
# pairs on the H200). The scratch ``base [n_chunks, EP]`` first holds each chunk's per-expert
# counts, then (in place) where each chunk's pairs of each expert start in the sorted list.
@triton.jit(do_not_specialize=["NUM_PAIRS", "OFFSET", "TOKENS", "TOTAL", "CODE"])
def align_count_kernel(ids_ptr, base_ptr, NUM_PAIRS, OFFSET,
                       x_ptr, q_ptr, s_ptr, TOKENS, HIDDEN, stride_x, stride_q, stride_st,
                       stride_sk, rec_ptr, TOTAL, CODE, NUM_EXPERTS: tl.constexpr,
                       EP: tl.constexpr, CHUNK: tl.constexpr, QUANTISE: tl.constexpr,
                       BLOCK_T: tl.constexpr, DOT_F32: tl.constexpr, CHECK_IDS: tl.constexpr):
    """Program ``c`` below the chunk count: ``base[c, e]`` = pairs of chunk ``c`` routed to
    local expert ``e``; ``CHECK_IDS``: the chunk's ids outside ``[0, TOTAL)`` reported
    (``_report_ids``). ``QUANTISE``: the programs past it quantise the input's tiles."""
    c = tl.program_id(0)
    if QUANTISE:
        n_chunks = tl.cdiv(NUM_PAIRS, CHUNK)
        if c >= n_chunks:
            _quantise_tile(x_ptr, q_ptr, s_ptr, c - n_chunks, TOKENS, HIDDEN, stride_x,
                           stride_q, stride_st, stride_sk, BLOCK_T, DOT_F32)
            return
    e = tl.arange(0, EP)
    i = c * CHUNK + tl.arange(0, CHUNK)
    inside = i < NUM_PAIRS
    raw = tl.load(ids_ptr + i, mask=inside, other=0).to(tl.int32)
    key = _local_key(raw, inside, OFFSET, NUM_EXPERTS, EP)
    tl.store(base_ptr + c * EP + e, tl.sum((key[:, None] == e[None, :]).to(tl.int32), axis=0))
    if CHECK_IDS:
        bad = inside & ((raw < 0) | (raw >= TOTAL))
        _report_ids(ids_ptr, rec_ptr, CODE, TOTAL, tl.min(tl.where(bad, i, NUM_PAIRS), axis=0),
                    tl.sum(bad.to(tl.int32), axis=0))


@triton.jit(do_not_specialize=["N_CHUNKS", "ROWS", "NUM_PAIRS"])
def align_offsets_kernel(base_ptr, block_expert_ptr, num_blocks_ptr, sorted_ptr, N_CHUNKS, ROWS,
                         NUM_PAIRS, NUM_EXPERTS: tl.constexpr, EP: tl.constexpr,
                         BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, GROUP: tl.constexpr,
                         FILL: tl.constexpr):
    """One program: expert segment starts (padded to BLOCK_M), ``block_expert``, ``num_blocks``,
    and ``base[c, e]`` = start of expert ``e``'s segment + the pairs of ``e`` in chunks ``< c``;
    every row of ``sorted [ROWS]`` set to the padding sentinel ``NUM_PAIRS`` (the scatter launch
    after it overwrites the used rows), FILL rows at a time."""
    for r0 in range(0, ROWS, FILL):
        r = r0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + r, tl.zeros([FILL], tl.int32) + NUM_PAIRS, mask=r < ROWS)
    e = tl.arange(0, EP)
    g = tl.arange(0, GROUP)
    counts = tl.zeros([EP], tl.int32)
    for c0 in range(0, N_CHUNKS, GROUP):
        ok = (c0 + g < N_CHUNKS)[:, None]
        counts += tl.sum(tl.load(base_ptr + (c0 + g)[:, None] * EP + e[None, :], mask=ok,
                                 other=0), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    tl.store(num_blocks_ptr, tl.sum(padded, axis=0) // BLOCK_M)
    lane = tl.arange(0, CHUNK)
    for b0 in range(0, ROWS // BLOCK_M, CHUNK):
        b = b0 + lane
        before = tl.sum((end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.minimum(before, NUM_EXPERTS - 1),
                 mask=b < ROWS // BLOCK_M)
    running = end - padded
    for c0 in range(0, N_CHUNKS, GROUP):
        ptrs = base_ptr + (c0 + g)[:, None] * EP + e[None, :]
        ok = (c0 + g < N_CHUNKS)[:, None]
        h = tl.load(ptrs, mask=ok, other=0)
        tl.store(ptrs, running[None, :] + tl.cumsum(h, axis=0) - h, mask=ok)
        running += tl.sum(h, axis=0)


@triton.jit(do_not_specialize=["NUM_PAIRS", "OFFSET"])
def align_scatter_kernel(ids_ptr, base_ptr, sorted_ptr, NUM_PAIRS, OFFSET,
                         NUM_EXPERTS: tl.constexpr, EP: tl.constexpr, CHUNK: tl.constexpr):
    """Program ``c``: each local pair of chunk ``c`` to ``base[c, expert]`` + its rank among the
    chunk's pairs of that expert (so the order within an expert stays ascending)."""
    c = tl.program_id(0)
    e = tl.arange(0, EP)
    i = c * CHUNK + tl.arange(0, CHUNK)
    key = _local_experts(ids_ptr, i, NUM_PAIRS, OFFSET, NUM_EXPERTS, EP)
    onehot = (key[:, None] == e[None, :]).to(tl.int32)
    rank = tl.cumsum(onehot, axis=0)
    base = tl.load(base_ptr + c * EP + e)
    pos = tl.sum(onehot * (base[None, :] + rank - 1), axis=1)
    tl.store(sorted_ptr + pos, i, mask=key < EP)


@triton.jit
def _round_e4m3(v):
    """float32 ``v`` (|v| <= 448) rounded to the nearest float8_e4m3fn value, ties to even, by
    arithmetic: Triton's interpreter converts some values to fp8 wrongly (-127.55 -> -64), so
    the CPU path rounds this way; the GPU converts in hardware."""
    bits = v.to(tl.int32, bitcast=True)
    exp = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # e4m3: 3 mantissa bits, min exponent -6
    step = ((exp - 3 + 127) << 23).to(tl.float32, bitcast=True)
    r = v / step
    fl = tl.floor(r)
    d = r - fl
    odd = (fl.to(tl.int32) & 1) != 0
    return (fl + ((d > 0.5) | ((d == 0.5) & odd)).to(tl.float32)) * step


@triton.jit
def _quantise_rows(a, FP8: tl.constexpr, DOT_F32: tl.constexpr):
    """``(q, scale)``: a ``[BLOCK_M, 128]`` tile as fp8 per row, ``a ~= q * scale[:, None]``,
    ``scale = amax / 448`` (e4m3's largest finite value); an all-zero row gets scale 0.
    ``DOT_F32`` (the interpreter): ``q`` is float32 holding the fp8 values."""
    af = a.to(tl.float32)
    amax = tl.max(tl.abs(af), axis=1)
    inv = tl.where(amax > 0.0, 448.0 / tl.maximum(amax, 1e-30), 0.0)
    scaled = af * inv[:, None]
    if DOT_F32:
        q = _round_e4m3(scaled)
    else:
        q = scaled.to(FP8)
    return q, amax * (1.0 / 448.0)


@triton.jit
def _quantise_tile(x_ptr, q_ptr, s_ptr, tile, TOKENS, HIDDEN, stride_x, stride_q, stride_st,
                   stride_sk, BLOCK_T: tl.constexpr, DOT_F32: tl.constexpr):
    """Tile ``tile`` of ``x [T, H]`` (half precision; tiles of BLOCK_T tokens x one 128-wide
    group, token blocks outer) -> ``q`` fp8 and ``s [T, ceil(H/128)]`` float32, exactly as
    ``_quantise_rows`` quantises gemm1's output tiles: once per token, not per (token, slot)
    pair and column tile."""
    groups = tl.cdiv(HIDDEN, 128)
    t = (tile // groups) * BLOCK_T + tl.arange(0, BLOCK_T)
    group = tile % groups
    k = group * 128 + tl.arange(0, 128)
    ok = (t < TOKENS)[:, None] & (k < HIDDEN)[None, :]
    a = tl.load(x_ptr + t[:, None].to(tl.int64) * stride_x + k[None, :], mask=ok, other=0.0)
    q, scale = _quantise_rows(a, q_ptr.dtype.element_ty, DOT_F32)
    tl.store(q_ptr + t[:, None].to(tl.int64) * stride_q + k[None, :], q, mask=ok)
    tl.store(s_ptr + t.to(tl.int64) * stride_st + group * stride_sk, scale, mask=t < TOKENS)


@triton.jit
def _tile_of(GRID_M, GRID_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(M-block, column tile) of this program on a 1-D grid of ``GRID_M * GRID_N``: groups of
    ``GROUP_M`` M-blocks walk the column tiles together, M-block fastest. The M-blocks of one
    expert are neighbours (so are their weight tiles' readers) and a group's input rows stay in
    L2 across its column tiles instead of being read again from memory for every tile."""
    pid = tl.program_id(0)
    per_group = GROUP_M * GRID_N
    first = (pid // per_group) * GROUP_M
    size = tl.minimum(GRID_M - first, GROUP_M)
    within = pid % per_group
    return first + within % size, within // size


# NUM_PAIRS (tokens x top_k) changes every call: not specialised on its value (one compile
# for every token count)
@triton.jit(do_not_specialize=["NUM_PAIRS", "GRID_M"])
def gemm1_kernel(
    x_ptr, xs_ptr, w1_ptr, w1_desc, s1_ptr, inter_ptr, inter_s_ptr, sorted_ptr, block_expert_ptr,
    num_blocks_ptr, weights_ptr,
    NUM_PAIRS, HIDDEN, INTER, GRID_M,
    stride_xt, stride_xst, stride_xsk, stride_we, stride_wn, stride_se, stride_sn, stride_sk,
    stride_ir, stride_isr,
    TOP_K: tl.constexpr, ACTIVATION: tl.constexpr, QUANT: tl.constexpr,
    SCALES_ON_INPUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
    GRID_N: tl.constexpr, GROUP_M: tl.constexpr, W_TMA: tl.constexpr,
):
    """QUANT: 0 none, 1 fp8 128x128 block scales ``s1 [E, ceil(2I/128), ceil(H/128)]`` (W8A8,
    ``BLOCK_K == BLOCK_N == 128``; x is float8_e4m3fn with 1x128 scales ``xs [T, ceil(H/128)]``;
    the intermediate is written in fp8 with scales ``inter_s [R, ceil(I/128)]``), 2 fp8
    per-tensor ``s1 [E, 2]`` (up, gate). ``EVEN_K``: ``HIDDEN % BLOCK_K == 0``. ``W_TMA``: the
    weight tiles come through ``w1_desc``, a tensor descriptor of w1 as ``[E * 2I, H]`` with
    ``[BLOCK_N, BLOCK_K]`` blocks (the copy engine fills past H with zeros), else through
    pointers."""
    b, tile_n = _tile_of(GRID_M, GRID_N, GROUP_M)
    if b >= tl.load(num_blocks_ptr):
        return
    expert = tl.load(block_expert_ptr + b).to(tl.int64)
    rows = b * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    row_ok = pair < NUM_PAIRS
    token = tl.where(row_ok, pair // TOP_K, 0)  # padding reads token 0, never stored
    n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    n_w = n % INTER  # in-bounds weight rows for the edge tile (those columns are not stored)
    kk = tl.arange(0, BLOCK_K)

    a_ptrs = x_ptr + token[:, None].to(tl.int64) * stride_xt + kk[None, :]
    up_ptrs = w1_ptr + expert * stride_we + n_w[None, :].to(tl.int64) * stride_wn + kk[:, None]
    gate_ptrs = up_ptrs + INTER * stride_wn
    if SCALES_ON_INPUT:
        route_w = tl.load(weights_ptr + pair, mask=row_ok, other=0.0)
    if QUANT == 1:
        s_up = s1_ptr + expert * stride_se + (n_w // 128) * stride_sn
        s_gate = s1_ptr + expert * stride_se + ((n_w + INTER) // 128) * stride_sn
    up_row = (expert * 2 * INTER + tile_n * BLOCK_N).to(tl.int32)  # W_TMA: the tile's first row
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        if W_TMA:  # rows past the tile's I columns belong to gate / the next expert: not stored
            if EVEN_K:
                a = tl.load(a_ptrs)
            else:
                a = tl.load(a_ptrs, mask=(kk < HIDDEN - k0)[None, :], other=0.0)
            wu = w1_desc.load([up_row, k0]).T
            wg = w1_desc.load([up_row + INTER, k0]).T
        elif EVEN_K:
            a = tl.load(a_ptrs)
            wu = tl.load(up_ptrs)
            wg = tl.load(gate_ptrs)
        else:
            k_ok = kk < HIDDEN - k0
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            wu = tl.load(up_ptrs, mask=k_ok[:, None], other=0.0)
            wg = tl.load(gate_ptrs, mask=k_ok[:, None], other=0.0)
        if QUANT == 1:  # x is fp8 with 1x128 scales (``_quantise_tile`` or the caller)
            a_s = tl.load(xs_ptr + token.to(tl.int64) * stride_xst + (k0 // 128) * stride_xsk)
            if SCALES_ON_INPUT:  # linear: the routing weight folds into the row scale
                a_s = a_s * route_w
            if DOT_F32:
                a = a.to(tl.float32)
                wu = wu.to(tl.float32)
                wg = wg.to(tl.float32)
            su = tl.load(s_up + (k0 // 128) * stride_sk)
            sg = tl.load(s_gate + (k0 // 128) * stride_sk)
            acc_up += tl.dot(a, wu) * (a_s[:, None] * su[None, :])
            acc_gate += tl.dot(a, wg) * (a_s[:, None] * sg[None, :])
        else:
            if SCALES_ON_INPUT:
                a = a.to(tl.float32) * route_w[:, None]
                if not DOT_F32:  # back to the input dtype (the interpreter's bf16 cast truncates)
                    a = a.to(x_ptr.dtype.element_ty)
            if DOT_F32:  # the interpreter's tl.dot mishandles bfloat16
                a = a.to(tl.float32)
                wu = wu.to(tl.float32)
                wg = wg.to(tl.float32)
            else:
                wu = wu.to(a.dtype)
                wg = wg.to(a.dtype)
            acc_up = tl.dot(a, wu, acc_up)
            acc_gate = tl.dot(a, wg, acc_gate)
        a_ptrs += BLOCK_K
        up_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K
    if QUANT == 2:
        acc_up *= tl.load(s1_ptr + expert * stride_se)
        acc_gate *= tl.load(s1_ptr + expert * stride_se + stride_sn)
    h = _activation(acc_gate, ACTIVATION) * acc_up
    out_ptrs = inter_ptr + rows[:, None].to(tl.int64) * stride_ir + n[None, :]
    if QUANT == 1:  # the tile is one 128-wide group: fp8 per row, its scale beside
        h, h_s = _quantise_rows(tl.where(n_ok[None, :], h, 0.0), inter_ptr.dtype.element_ty,
                                DOT_F32)
        tl.store(inter_s_ptr + rows.to(tl.int64) * stride_isr + tile_n, h_s,
                 mask=row_ok)
    tl.store(out_ptrs, h.to(inter_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["NUM_PAIRS", "GRID_M"])
def gemm2_kernel(
    inter_ptr, inter_s_ptr, w2_ptr, w2_desc, s2_ptr, result_ptr, sorted_ptr, block_expert_ptr,
    num_blocks_ptr, weights_ptr,
    NUM_PAIRS, HIDDEN, INTER, GRID_M,
    stride_ir, stride_isr, stride_we, stride_wn, stride_se, stride_sn, stride_sk, stride_rp,
    QUANT: tl.constexpr, SCALES_ON_INPUT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
    GRID_N: tl.constexpr, GROUP_M: tl.constexpr, W_TMA: tl.constexpr,
):
    """QUANT: 0 none, 1 fp8 128x128 block scales ``s2 [E, ceil(H/128), ceil(I/128)]`` (W8A8,
    ``BLOCK_K == 128``: the intermediate is fp8 with scales ``inter_s [R, ceil(I/128)]``), 2 fp8
    per-tensor ``s2 [E]``. ``EVEN_K``: ``INTER % BLOCK_K == 0``. ``W_TMA``: the weight tiles
    come through ``w2_desc``, w2 as ``[E * H, I]`` in ``[BLOCK_N, BLOCK_K]`` blocks."""
    b, tile_n = _tile_of(GRID_M, GRID_N, GROUP_M)
    if b >= tl.load(num_blocks_ptr):
        return
    expert = tl.load(block_expert_ptr + b).to(tl.int64)
    rows = b * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    row_ok = pair < NUM_PAIRS
    n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < HIDDEN
    n_w = n % HIDDEN
    kk = tl.arange(0, BLOCK_K)

    # padding rows of the intermediate are unwritten: masked to 0 (never stored anyway)
    a_ptrs = inter_ptr + rows[:, None].to(tl.int64) * stride_ir + kk[None, :]
    w_ptrs = w2_ptr + expert * stride_we + n_w[None, :].to(tl.int64) * stride_wn + kk[:, None]
    if QUANT == 1:
        s_ptrs = s2_ptr + expert * stride_se + (n_w // 128) * stride_sn
    w_row = (expert * HIDDEN + tile_n * BLOCK_N).to(tl.int32)  # W_TMA: the tile's first row
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        if W_TMA:  # rows past H belong to the next expert: not stored
            if EVEN_K:
                a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            else:
                a = tl.load(a_ptrs, mask=row_ok[:, None] & (kk < INTER - k0)[None, :], other=0.0)
            w = w2_desc.load([w_row, k0]).T
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            w = tl.load(w_ptrs)
        else:
            k_ok = kk < INTER - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        if QUANT == 1:  # fp8 intermediate with its 1x128 scales (gemm1's epilogue)
            a_s = tl.load(inter_s_ptr + rows.to(tl.int64) * stride_isr + k0 // 128, mask=row_ok,
                          other=0.0)
            if DOT_F32:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            s = tl.load(s_ptrs + (k0 // 128) * stride_sk)
            acc += tl.dot(a, w) * (a_s[:, None] * s[None, :])
        else:
            if DOT_F32:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            else:
                w = w.to(a.dtype)
            acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if QUANT == 2:
        acc *= tl.load(s2_ptr + expert * stride_se)
    if not SCALES_ON_INPUT:
        acc *= tl.load(weights_ptr + pair, mask=row_ok, other=0.0)[:, None]
    out_ptrs = result_ptr + pair[:, None].to(tl.int64) * stride_rp + n[None, :]
    tl.store(out_ptrs, acc.to(result_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["NUM_TOKENS", "OFFSET"])
def finalize_kernel(part_ptr, ids_ptr, out_ptr, NUM_TOKENS, HIDDEN, OFFSET, stride_pp,
                    stride_ot, NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr,
                    BLOCK_H: tl.constexpr):
    """``out[t] = sum over slots s, in slot order, of part[t * TOP_K + s]`` for the slots routed
    to a local expert (a slot of another rank was never written by gemm2 and is skipped);
    float32 sums. Program: one token x BLOCK_H columns."""
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < HIDDEN
    acc = tl.zeros([BLOCK_H], tl.float32)
    for slot in tl.static_range(TOP_K):
        pair = t.to(tl.int64) * TOP_K + slot
        local = tl.load(ids_ptr + pair).to(tl.int32) - OFFSET
        is_local = (local >= 0) & (local < NUM_EXPERTS)
        # a [BLOCK_H] operand first: the interpreter makes a non-boolean mask of vector & scalar
        ok = h_ok & (tl.full([BLOCK_H], 1, tl.int1) & is_local)
        acc += tl.load(part_ptr + pair * stride_pp + h, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h, acc.to(out_ptr.dtype.element_ty),
             mask=h_ok)
