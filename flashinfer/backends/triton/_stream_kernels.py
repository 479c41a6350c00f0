"""@triton.jit helpers shared by the row-streaming sampling kernels (``_nucleus_kernels``,
``_top_k_two_pass_kernels``, ``_logits_draw_kernels``): the first pass over a row, the k-th
largest value from the lanes' candidates (and exactly, by bisection), the draw by the inverse CDF
in position-major order, the output row of a program."""

import triton
import triton.language as tl

from ._sampling_kernels import _insert, _ord, _unord

#: ordered int of the smallest finite float (-FLT_MAX): the least logit that counts
FINITE_FLOOR = tl.constexpr(-2139095040)


@triton.jit
def first_pass(row_ptr, V, BLOCK: tl.constexpr, TOP4: tl.constexpr, LOGITS: tl.constexpr):
    """One pass over a row: per block position the four largest values ``top0 >= top1 >= top2
    >= top3`` (TOP4; else only the largest in ``top0``), ``-inf`` where none. Probabilities:
    positive values only, the per-position sums, and whether the row holds a NaN, a negative
    value or +inf. Logits (LOGITS): every value but NaN, and whether the row holds a NaN or +inf;
    sums are not kept. The next block is loaded before this one is worked on."""
    lane = tl.arange(0, BLOCK)
    ninf = tl.full([BLOCK], float("-inf"), tl.float32)
    top0 = ninf
    top1 = ninf
    top2 = ninf
    top3 = ninf
    total = tl.zeros([BLOCK], tl.float32)
    bad = tl.zeros([BLOCK], tl.int32)
    other = float("-inf") if LOGITS else 0.0  # masked-off lanes: never a value, never bad
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=other)
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=other)
        if LOGITS:
            bad |= ((x != x) | (x == float("inf"))).to(tl.int32)
            val = tl.where(x == x, x, ninf)
        else:
            bad |= ((x != x) | (x < 0.0) | (x == float("inf"))).to(tl.int32)
            total += x
            val = tl.where(x > 0.0, x, ninf)
        if TOP4:
            top0, top1, top2, top3 = _insert(top0, top1, top2, top3, val)
        else:
            top0 = tl.maximum(top0, val)
    return top0, top1, top2, top3, total, tl.max(bad, axis=0) > 0


@triton.jit
def candidates_tau(top0, top1, top2, top3, k, floor_o, scratch, i, BLOCK: tl.constexpr,
                   G: tl.constexpr, CAP: tl.constexpr):
    """The k-th largest of the lanes' four largest values as an ordered int, at least
    ``floor_o`` (the smallest value that counts: 1 for probabilities, the smallest finite float
    for logits); the candidates' count at or above it (-1 when they overflowed their slots);
    the candidates' mass at or above it; and the candidates sorted, largest first (``-inf`` in
    the slots past them). The G group maxima of the lanes' largest values
    are G >= k distinct tokens, so tau is at least the smallest of them; the candidates at or
    above that bound (about G ln G) are compacted into CAP slots of the output row ``i`` of
    ``scratch`` and sorted there (a bitonic network). ``1 <= k <= G <= BLOCK``."""
    low = tl.min(tl.max(tl.reshape(top0, [G, BLOCK // G]), axis=1), axis=0)
    low_o = tl.maximum(_ord(low), floor_o)  # a group without a value: every candidate counts
    n_lane = ((_ord(top0) >= low_o).to(tl.int32) + (_ord(top1) >= low_o).to(tl.int32)
              + (_ord(top2) >= low_o).to(tl.int32) + (_ord(top3) >= low_o).to(tl.int32))
    n_c = tl.sum(n_lane, axis=0)
    fits = n_c <= CAP
    n_put = tl.where(fits, n_lane, 0)
    slot = scratch + i.to(tl.int64) * CAP + tl.cumsum(n_put, axis=0) - n_put
    tl.store(slot, top0, mask=n_put > 0)
    tl.store(slot + 1, top1, mask=n_put > 1)
    tl.store(slot + 2, top2, mask=n_put > 2)
    tl.store(slot + 3, top3, mask=n_put > 3)
    tl.debug_barrier()
    c_idx = tl.arange(0, CAP)
    cand = tl.load(scratch + i.to(tl.int64) * CAP + c_idx, mask=c_idx < tl.where(fits, n_c, 0),
                   other=float("-inf"))
    srt = tl.sort(cand, descending=True)
    kth = tl.max(tl.where(c_idx == k - 1, srt, float("-inf")), axis=0)
    tau_o = tl.maximum(_ord(kth), floor_o).to(tl.int64)
    above = _ord(cand) >= tau_o
    n_tau = tl.where(fits, tl.sum(above.to(tl.int32), axis=0), -1)
    return tau_o, n_tau, tl.sum(tl.where(above, cand, 0.0), axis=0), srt


@triton.jit
def exact_tau(row_ptr, V, k, floor_o, BLOCK: tl.constexpr):
    """The largest ordered int ``t >= floor_o`` with at least ``k`` tokens ``>= t`` (else
    ``floor_o``), by bisection: 32 counting passes."""
    lo = tl.zeros([], tl.int64) + floor_o
    hi = tl.full([], 2139095041, tl.int64)  # one past +inf: no token at or above
    for _ in range(32):
        mid = lo + (hi - lo) // 2
        n, _mass = count_at_least(row_ptr, V, _unord(mid.to(tl.int32)), 0.0, BLOCK, False)
        enough = n >= k
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    return lo


@triton.jit
def count_at_least(row_ptr, V, t, top, BLOCK: tl.constexpr, LOGITS: tl.constexpr):
    """How many tokens of the row are ``>= t``, and their sum (LOGITS: the sum of ``exp(x -
    top)``)."""
    lane = tl.arange(0, BLOCK)
    cnt = tl.zeros([BLOCK], tl.int32)
    mass = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(row_ptr + start + lane, mask=start + lane < V,
                    other=float("-inf")).to(tl.float32)
        cnt += (x >= t).to(tl.int32)
        if LOGITS:
            mass += tl.where(x >= t, tl.exp(x - top), 0.0)
        else:
            mass += tl.where(x >= t, x, 0.0)
    return tl.sum(cnt, axis=0), tl.sum(mass, axis=0)


@triton.jit
def pick_in_position_major_order(row_ptr, V, acc, target, thr, top, sub_ptr, sub_on,
                                 BLOCK: tl.constexpr, COL: tl.constexpr, LOGITS: tl.constexpr,
                                 SUB: tl.constexpr):
    """The token where the running weight, in position-major order, first exceeds ``target``:
    the position from the per-position weights ``acc [BLOCK]``, then the token from its column
    (``COL`` at a time). A token's weight where ``x > thr``: ``exp(x - top)`` (LOGITS), else
    ``x``; 0 elsewhere. SUB: ``x`` is the row minus the row at ``sub_ptr`` where ``sub_on``
    (a residual ``relu(t - d)`` with ``thr = 0``). When rounding keeps the column below the target: the column's last token with
    weight; -1 when no position has weight."""
    lane = tl.arange(0, BLOCK)
    ends = tl.cumsum(acc, axis=0)
    first = tl.min(tl.where((ends > target) & (acc > 0.0), lane, BLOCK), axis=0)
    found = first < BLOCK
    pos = tl.where(found, first, tl.max(tl.where(acc > 0.0, lane, -1), axis=0))
    rest = tl.where(found, target - tl.sum(tl.where(lane < pos, acc, 0.0), axis=0),
                    float("inf"))
    col = tl.arange(0, COL)
    n_col = tl.where(pos >= 0, (V - pos + BLOCK - 1) // BLOCK, 0)
    run = tl.zeros([], tl.float32)
    pick = tl.full([], -1, tl.int32)
    last = tl.full([], -1, tl.int32)
    for s0 in range(0, n_col, COL):
        j = s0 + col
        offs = pos + j * BLOCK
        if LOGITS:
            x = tl.load(row_ptr + offs, mask=j < n_col, other=float("-inf")).to(tl.float32)
            w = tl.where(x > thr, tl.exp(x - top), 0.0)
        else:
            x = tl.load(row_ptr + offs, mask=j < n_col, other=0.0).to(tl.float32)
            if SUB:
                sub_n = tl.where(sub_on, n_col, 0)
                x -= tl.load(sub_ptr + offs, mask=j < sub_n, other=0.0).to(tl.float32)
            w = tl.where(x > thr, x, 0.0)
        hit = (run + tl.cumsum(w, axis=0) > rest) & (w > 0.0)
        first_hit = tl.min(tl.where(hit, offs, 2147483647), axis=0)
        pick = tl.where((pick < 0) & (first_hit < 2147483647), first_hit, pick)
        last = tl.maximum(last, tl.max(tl.where(w > 0.0, offs, -1), axis=0))
        run += tl.sum(w, axis=0)
    return tl.where(pick >= 0, pick, last)


@triton.jit
def output_row(idx_ptr, i, R, HAS_IDX: tl.constexpr):
    """Output ``i``'s input row (``idx[i]`` with HAS_IDX): whether it lies in ``[0, R)``, and
    the row to read (0 when it does not)."""
    if HAS_IDX:
        row = tl.load(idx_ptr + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    row_ok = (row >= 0) & (row < R)
    return row_ok, tl.where(row_ok, row, 0)
