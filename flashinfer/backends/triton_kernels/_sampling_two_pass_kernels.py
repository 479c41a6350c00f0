"""@triton.jit kernel of the two-pass top-k sampler (variant ``two_pass`` of sampling_from_probs).

Why a second kernel: the general one (``_sampling_kernels``) needs only one or two passes over a
row for top-k 50 then top-p 0.9, but does much work per element in each (eight pivot counts and
masses, eight race trackers, top-four tracking, Philox and a logarithm): on the H200 it took
604 us at 256 x 128k where upstream FlashInfer took 137 (benchmarks/results/README.md). This
kernel does little per element, for the common case of a small top-k (``1 <= k <= BLOCK / 4``,
chosen on the host), with or without top-p (top-k first or joint), one program per row reading
``BLOCK`` elements a step:

1. **Pass 1**: per position of the block the four largest positive values (min / max
   exchanges), the row's sum and a bad flag (NaN, negative, infinite). A row that is not a
   distribution gives token 0 and ``valid = False``, as the contract says.
2. **Between the passes**: the ``G >= k`` group maxima of the lanes' largest values are distinct
   tokens, so ``tau`` (the k-th largest) is at least their minimum; the candidates at or above
   it (about ``G ln G``, 266 for ``G = 64``) are compacted into ``CAP`` slots through a scratch
   row and sorted there (a bitonic network, ``tl.sort``: on the H200 much cheaper than pivot
   searches over the fp32 order, 11 block-wide reductions each). From the sorted slots: ``tau``,
   and when top-p is on the smallest candidate top-p keeps (mass strictly above it below
   ``top_p`` times the top-k mass, or the row's sum when joint; the row's maximum is always
   kept): the keep boundary ``b``; and ``M``, the candidates' mass at or above ``b``. More
   candidates than slots: step 4.
3. **Pass 2**: per block position, the mass of ``{p >= b}`` and the count of ``{p >= tau}``;
   then one uniform ``u`` and the inverse CDF at ``u * M`` in position-major order (position 0's
   tokens ``0, BLOCK, 2 BLOCK, ...``, then position 1's, ...: any fixed order gives the same
   distribution, and this one needs no reduction across the block per step): the crossing
   position from one cumulative sum over the block, then the token within that position's
   column (``COL`` at a time). The candidates held every token ``>= tau`` iff the count equals
   theirs; then ``tau``, the top-k mass, ``b`` and ``M`` were exact and the draw is the answer.
   Both passes load the next block before working on the current one.
4. Otherwise (a block position held more than four of the row's top k, rare for ``k <= BLOCK /
   4``, or the candidates overflowed their slots), the same quantities are found exactly from full passes (bisection over the fp32 order:
   at most 31 + 32 counting passes), then pass 2 is repeated with them.

The kept set is the contract's (``reference.sampling.keep_mask``): ``p > 0``, fewer than ``k``
larger values, and (top-p) mass strictly above below ``top_p * total`` or the maximum. Sums are
float32 (the reference uses float64), so a token whose mass-above sits within rounding of the
top-p bound may be decided differently, as in the general kernel; the inverse CDF normalises by
the candidates' sum, which can differ from the pass's own running sum by rounding: when ``u *
M`` is not reached, the last kept token (in that order) is drawn (a ~1e-7 mass shift).

RNG: Philox4x32 keyed on the seed, counter ``(0, output row, 0xFFFF | offset_hi << 16,
offset_lo)``: one uniform per output row, a counter the general kernel never uses.
"""

import triton
import triton.language as tl
from triton.language.random import philox, uint_to_uniform_float

from ._sampling_kernels import _insert, _ord, _rng_words, _unord


@triton.jit
def _row_ge(row_ptr, V, t, BLOCK: tl.constexpr):
    """Full pass: count and mass of the positive tokens ``>= t`` (a float)."""
    lane = tl.arange(0, BLOCK)
    cnt = tl.zeros([BLOCK], tl.int32)
    mass = tl.zeros([BLOCK], tl.float32)
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=0.0)
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=0.0)
        hit = (x >= t) & (x > 0.0)
        cnt += hit.to(tl.int32)
        mass += tl.where(hit, x, 0.0)
    return tl.sum(cnt, axis=0), tl.sum(mass, axis=0)


@triton.jit
def _draw(row_ptr, V, b, target, tau, BLOCK: tl.constexpr, COL: tl.constexpr):
    """The inverse-CDF draw over the positive ``p >= b`` in *position-major* order (block
    position 0's tokens ``0, BLOCK, 2 BLOCK, ...``, then position 1's, ...): any fixed order gives
    the same distribution, and this one needs no reduction across the block per step. Returns the
    first token whose running sum exceeds ``target`` (else the last such token of the last
    position with weight, a rounding case; -1 when none) and the count of positive ``p >= tau``."""
    lane = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    cnt = tl.zeros([BLOCK], tl.int32)
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=0.0)
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=0.0)
        cnt += ((x >= tau) & (x > 0.0)).to(tl.int32)
        acc += tl.where((x >= b) & (x > 0.0), x, 0.0)
    ends = tl.cumsum(acc, axis=0)
    first = tl.min(tl.where((ends > target) & (acc > 0.0), lane, BLOCK), axis=0)
    found = first < BLOCK
    pos = tl.where(found, first, tl.max(tl.where(acc > 0.0, lane, -1), axis=0))
    rest = tl.where(found, target - tl.sum(tl.where(lane < pos, acc, 0.0), axis=0),
                    float("inf"))
    # the position's own tokens, COL at a time
    col = tl.arange(0, COL)
    n_col = tl.where(pos >= 0, (V - pos + BLOCK - 1) // BLOCK, 0)
    run = tl.zeros([], tl.float32)
    pick = tl.full([], -1, tl.int32)
    last = tl.full([], -1, tl.int32)
    for s0 in range(0, n_col, COL):
        s = s0 + col
        offs = pos + s * BLOCK
        x = tl.load(row_ptr + offs, mask=s < n_col, other=0.0).to(tl.float32)
        w = tl.where((x >= b) & (x > 0.0), x, 0.0)
        hit = (run + tl.cumsum(w, axis=0) > rest) & (w > 0.0)
        first_hit = tl.min(tl.where(hit, offs, 2147483647), axis=0)
        pick = tl.where((pick < 0) & (first_hit < 2147483647), first_hit, pick)
        last = tl.maximum(last, tl.max(tl.where(w > 0.0, offs, -1), axis=0))
        run += tl.sum(w, axis=0)
    return tl.where(pick >= 0, pick, last), tl.sum(cnt, axis=0)


@triton.jit(do_not_specialize=["k_val", "p_val", "seed_val", "off_val", "R"])
def two_pass_topk_kernel(probs, out, valid, idx_ptr, p_ptr, k_val, p_val, seed_ptr, off_ptr,
                         seed_val, off_val, seed_stride, off_stride, R, V, stride_row, scratch,
                         HAS_IDX: tl.constexpr, HAS_P: tl.constexpr, P_T: tl.constexpr,
                         JOINT: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
                         BLOCK: tl.constexpr, G: tl.constexpr, CAP: tl.constexpr,
                         COL: tl.constexpr, PHILOX_ROUNDS: tl.constexpr):
    """``probs [R, V]`` fp32 -> ``out[i]`` int32, ``valid[i]``, for output row ``i`` (row
    ``idx[i]`` with HAS_IDX). ``1 <= k_val < V``, ``k_val <= G <= BLOCK`` and ``4 k_val <= BLOCK``
    (the host checks); ``top_p`` scalar ``p_val`` or per row (P_T); ``scratch`` fp32, ``CAP`` per
    output row."""
    i = tl.program_id(0)
    if HAS_IDX:
        row = tl.load(idx_ptr + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    row_ok = (row >= 0) & (row < R)
    row_ptr = probs + tl.where(row_ok, row, 0) * stride_row
    k = tl.zeros([], tl.int32) + k_val
    top_p = tl.full([], 1.0, tl.float32)
    if HAS_P:
        if P_T:
            top_p = tl.load(p_ptr + tl.where(row_ok, row, 0)).to(tl.float32)
        else:
            top_p = top_p * 0.0 + p_val
    p_on = top_p < 1.0

    # pass 1: the lanes' four largest positive values, the sum, the bad flag (the next block is
    # loaded before this one is worked on)
    lane = tl.arange(0, BLOCK)
    ninf = tl.full([BLOCK], float("-inf"), tl.float32)
    top0 = ninf
    top1 = ninf
    top2 = ninf
    top3 = ninf
    total = tl.zeros([BLOCK], tl.float32)
    bad = tl.zeros([BLOCK], tl.int32)
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=0.0)
    for start in range(0, V, BLOCK):
        mask = start + lane < V
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=0.0)
        bad |= (mask & ((x != x) | (x < 0.0) | (x == float("inf")))).to(tl.int32)
        total += x
        top0, top1, top2, top3 = _insert(top0, top1, top2, top3, tl.where(x > 0.0, x, ninf))
    s_all = tl.sum(total, axis=0)
    ok = row_ok & (tl.max(bad, axis=0) == 0) & (s_all > 0.0) & (s_all < float("inf"))
    rmax = tl.max(top0, axis=0)

    # between the passes. The G group maxima of the lanes' largest values are G >= k distinct
    # tokens, so tau >= `low`, the smallest of them; the candidates at or above it (a few hundred
    # for G = 64) are compacted into CAP slots (through `scratch`), and tau, the top-k mass, the
    # boundary b and its mass are read from those, sorted
    low = tl.min(tl.max(tl.reshape(top0, [G, BLOCK // G]), axis=1), axis=0)
    low_o = tl.where(low > 0.0, _ord(low), 1)  # a group without positives: every positive
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
    oc = _ord(cand)
    # sorted (bitonic network over CAP slots, no loop over steps): tau is the k-th, or the
    # smallest positive float when fewer than k candidates are positive
    srt = tl.sort(cand, descending=True)
    tau_o = tl.maximum(_ord(tl.max(tl.where(c_idx == k - 1, srt, float("-inf")), axis=0)), 1)
    tau_o = tau_o.to(tl.int64)
    # the proof's count; -1 (never a row's count) when the candidates did not fit: exact path
    n_tau = tl.where(fits, tl.sum((oc >= tau_o).to(tl.int32), axis=0), -1)
    s_k = tl.sum(tl.where(oc >= tau_o, cand, 0.0), axis=0)
    b_o = tau_o
    if p_on:
        bound = top_p * tl.where(JOINT == 0, s_k, s_all)
        # b: the smallest candidate >= tau whose mass strictly above is below the bound. The
        # sorted order's exclusive prefix sum is that mass at the first of a run of ties and
        # only grows along the run, so the last slot under the bound holds b
        pos = tl.where(srt > 0.0, srt, 0.0)
        under = (tl.cumsum(pos, axis=0) - pos < bound) & (_ord(srt) >= tau_o)
        b = tl.min(tl.where(c_idx == tl.max(tl.where(under, c_idx, -1), axis=0), srt,
                            float("inf")), axis=0)  # none under it (top_p = 0): the max only
        b_o = tl.minimum(tl.maximum(_ord(b).to(tl.int64), tau_o), _ord(rmax).to(tl.int64))
    m_b = tl.sum(tl.where(oc >= b_o, cand, 0.0), axis=0)

    # pass 2: the draw and the proof that the candidates held every token >= tau
    seed, off_lo, off_hi = _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                                      off_stride, i, SEED_T, OFF_T)
    zero = tl.zeros([], tl.uint32)
    r0, _r1, _r2, _r3 = philox(seed, zero, i.to(tl.uint32), 0xFFFF | (off_hi << 16), off_lo,
                               PHILOX_ROUNDS)
    u = uint_to_uniform_float(r0)
    tau = _unord(tau_o.to(tl.int32))
    res = tl.zeros([], tl.int32)
    if ok:
        res, n_full = _draw(row_ptr, V, _unord(b_o.to(tl.int32)), u * m_b, tau, BLOCK, COL)
        if n_full != n_tau:  # exact boundaries from full passes
            lo = tl.full([], 1, tl.int64)
            hi = tl.full([], 2139095040, tl.int64)
            for _ in range(31):
                mid = lo + (hi - lo) // 2
                cnt, _m = _row_ge(row_ptr, V, _unord(mid.to(tl.int32)), BLOCK)
                lo = tl.where(cnt >= k, mid, lo)
                hi = tl.where(cnt >= k, hi, mid)
            tau_o = lo
            _n, s_k = _row_ge(row_ptr, V, _unord(tau_o.to(tl.int32)), BLOCK)
            b_o = tau_o
            if p_on:
                bound = top_p * tl.where(JOINT == 0, s_k, s_all)
                lo2 = tau_o - 1
                hi2 = tl.full([], 2139095040, tl.int64)
                for _ in range(32):
                    mid = lo2 + (hi2 - lo2) // 2
                    _c, above = _row_ge(row_ptr, V, _unord((mid + 1).to(tl.int32)), BLOCK)
                    lo2 = tl.where(above >= bound, mid, lo2)
                    hi2 = tl.where(above >= bound, hi2, mid)
                b_o = tl.minimum(tl.maximum(hi2, tau_o), _ord(rmax).to(tl.int64))
            _c, m_b = _row_ge(row_ptr, V, _unord(b_o.to(tl.int32)), BLOCK)
            res, n_full = _draw(row_ptr, V, _unord(b_o.to(tl.int32)), u * m_b,
                                _unord(tau_o.to(tl.int32)), BLOCK, COL)
    tl.store(out + i, tl.where(ok, tl.maximum(res, 0), 0))
    tl.store(valid + i, ok)
