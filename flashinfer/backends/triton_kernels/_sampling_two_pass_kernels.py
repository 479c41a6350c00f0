"""@triton.jit kernel of the two-pass sampler (variant ``two_pass`` of sampling_from_probs).

Why a second kernel: the general one (``_sampling_kernels``) needs only one or two passes over a
row for top-k 50 then top-p 0.9, but does much work per element in each (eight pivot counts and
masses, eight race trackers, top-four tracking, Philox and a logarithm): on the H200 it took
604 us at 256 x 128k where upstream FlashInfer took 137 (benchmarks/results/README.md). This
kernel does little per element, one program per row reading ``BLOCK`` elements a step, for three
common cases (MODE, chosen on the host):

* MODE 0, plain sampling: pass 2 alone (one pass over the row).
* MODE 1, min-p: pass 1 for the maximum, then pass 2 with ``b = min_p * max``.
* MODE 2, a small top-k (``1 <= k <= BLOCK / 4``) with or without top-p (top-k first or
  joint): all of the steps below.

1. **Pass 1**: the row's sum, maximum and a bad flag (NaN, negative, infinite), and (MODE 2)
   per position of the block the four largest positive values (min / max exchanges). A row that
   is not a distribution gives token 0 and ``valid = False``, as the contract says.
2. **Between the passes** (MODE 2): the ``G >= k`` group maxima of the lanes' largest values are
   distinct tokens, so ``tau`` (the k-th largest) is at least their minimum; the candidates at
   or above it (about ``G ln G``, 266 for ``G = 64``) are compacted into ``CAP`` slots through a
   scratch row and sorted there (a bitonic network, ``tl.sort``: on the H200 much cheaper than
   pivot searches over the fp32 order, 11 block-wide reductions each). From the sorted slots:
   ``tau`` and, when top-p is on, the smallest candidate top-p keeps (mass strictly above it
   below ``top_p`` times the top-k mass, or the row's sum when joint; the row's maximum is
   always kept): the keep boundary ``b``. More candidates than slots: step 4.
3. **Pass 2**: per block position, the mass of ``{p >= b}`` and the count of ``{p >= tau}``
   (MODE 0 also checks for bad values here); then one uniform ``u`` and the inverse CDF at ``u``
   times the kept mass in position-major order (position 0's tokens ``0, BLOCK, 2 BLOCK, ...``,
   then position 1's, ...: any fixed order gives the same distribution, and this one needs no
   reduction across the block per step): the crossing position from one cumulative sum over
   the block, then the token within that position's column (``COL`` at a time). The candidates
   held every token ``>= tau`` iff the count equals theirs; then ``tau`` and ``b`` were exact
   and the draw is the answer. Both passes load the next block before working on the current
   one.
4. Otherwise (a block position held more than four of the row's top k, rare for ``k <= BLOCK /
   4``, or the candidates overflowed their slots), ``tau`` and ``b`` are found exactly from full
   passes (bisection over the fp32 order: at most 31 + 32 counting passes), then pass 2 is
   repeated with them.

The kept set is the contract's (``reference.sampling.keep_mask``): ``p > 0``, fewer than ``k``
larger values, (top-p) mass strictly above below ``top_p * total`` or the maximum, (min-p) ``p >=
min_p * max``. Sums and the min-p bound are float32 (the reference uses float64), so a token
within rounding of a top-p or min-p bound may be decided differently, as in the general kernel.
When rounding keeps the running sum below ``u`` times the kept mass, the last kept token (in
that order) is drawn.

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
def _draw(row_ptr, V, b, u, tau, BLOCK: tl.constexpr, COL: tl.constexpr,
          CHECK: tl.constexpr):
    """The inverse-CDF draw at ``u`` (in [0, 1)) over the positive ``p >= b`` in *position-major*
    order (block position 0's tokens ``0, BLOCK, 2 BLOCK, ...``, then position 1's, ...): any
    fixed order gives the same distribution, and this one needs no reduction across the block per
    step. Returns the first token whose running sum exceeds ``u`` times the kept mass (else the
    last kept token of the last position with weight, a rounding case; -1 when none), the count
    of positive ``p >= tau``, the kept mass, and (CHECK) whether the row holds a NaN, a negative
    value or +inf."""
    lane = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    cnt = tl.zeros([BLOCK], tl.int32)
    bad = tl.zeros([BLOCK], tl.int32)
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=0.0)
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=0.0)
        if CHECK:  # masked-off lanes read 0.0: never bad
            bad |= ((x != x) | (x < 0.0) | (x == float("inf"))).to(tl.int32)
        cnt += ((x >= tau) & (x > 0.0)).to(tl.int32)
        acc += tl.where((x >= b) & (x > 0.0), x, 0.0)
    ends = tl.cumsum(acc, axis=0)
    mass = tl.sum(acc, axis=0)
    target = u * mass
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
    return tl.where(pick >= 0, pick, last), tl.sum(cnt, axis=0), mass, tl.max(bad, axis=0) > 0


@triton.jit
def _top_k_bounds(top0, top1, top2, top3, s_all, rmax, k, top_p, p_on, scratch, i,
                  JOINT: tl.constexpr, BLOCK: tl.constexpr, G: tl.constexpr, CAP: tl.constexpr):
    """From the lanes' four largest values: ``tau`` (the k-th largest) and the keep boundary
    ``b`` as ordered ints, and the candidates' count ``>= tau`` (-1 when they overflowed their
    slots). The G group maxima of the lanes' largest values are G >= k distinct tokens, so tau is
    at least ``low``, the smallest of them; the candidates at or above it (a few hundred for G =
    64) are compacted into CAP slots through ``scratch`` and sorted there."""
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
    # sorted (a bitonic network over CAP slots): tau is the k-th, or the smallest positive float
    # when fewer than k candidates are positive
    srt = tl.sort(cand, descending=True)
    tau_o = tl.maximum(_ord(tl.max(tl.where(c_idx == k - 1, srt, float("-inf")), axis=0)), 1)
    tau_o = tau_o.to(tl.int64)
    n_tau = tl.where(fits, tl.sum((oc >= tau_o).to(tl.int32), axis=0), -1)
    b_o = tau_o
    if p_on:
        s_k = tl.sum(tl.where(oc >= tau_o, cand, 0.0), axis=0)
        bound = top_p * tl.where(JOINT == 0, s_k, s_all)
        # b: the smallest candidate >= tau whose mass strictly above is below the bound. The
        # sorted order's exclusive prefix sum is that mass at the first of a run of ties and
        # only grows along the run, so the last slot under the bound holds b
        pos = tl.where(srt > 0.0, srt, 0.0)
        under = (tl.cumsum(pos, axis=0) - pos < bound) & (_ord(srt) >= tau_o)
        b = tl.min(tl.where(c_idx == tl.max(tl.where(under, c_idx, -1), axis=0), srt,
                            float("inf")), axis=0)  # none under it (top_p = 0): the max only
        b_o = tl.minimum(tl.maximum(_ord(b).to(tl.int64), tau_o), _ord(rmax).to(tl.int64))
    return tau_o, b_o, n_tau


@triton.jit
def _exact_top_k_bounds(row_ptr, V, k, top_p, p_on, s_all, rmax, JOINT: tl.constexpr,
                        BLOCK: tl.constexpr):
    """``tau`` and ``b`` (ordered ints) from full passes: bisection over the fp32 order, at most
    31 + 32 counting passes."""
    lo = tl.full([], 1, tl.int64)  # ordered int of the smallest positive float
    hi = tl.full([], 2139095040, tl.int64)  # ordered int of +inf
    for _ in range(31):
        mid = lo + (hi - lo) // 2
        cnt, _m = _row_ge(row_ptr, V, _unord(mid.to(tl.int32)), BLOCK)
        lo = tl.where(cnt >= k, mid, lo)
        hi = tl.where(cnt >= k, hi, mid)
    tau_o = lo
    b_o = tau_o
    if p_on:
        _n, s_k = _row_ge(row_ptr, V, _unord(tau_o.to(tl.int32)), BLOCK)
        bound = top_p * tl.where(JOINT == 0, s_k, s_all)
        lo2 = tau_o - 1  # mass above lo2 >= bound (or lo2 below tau)
        hi2 = tl.full([], 2139095040, tl.int64)
        for _ in range(32):
            mid = lo2 + (hi2 - lo2) // 2
            _c, above = _row_ge(row_ptr, V, _unord((mid + 1).to(tl.int32)), BLOCK)
            lo2 = tl.where(above >= bound, mid, lo2)
            hi2 = tl.where(above >= bound, hi2, mid)
        b_o = tl.minimum(tl.maximum(hi2, tau_o), _ord(rmax).to(tl.int64))
    return tau_o, b_o


@triton.jit(do_not_specialize=["k_val", "p_val", "mp_val", "seed_val", "off_val", "R"])
def two_pass_sample_kernel(probs, out, valid, idx_ptr, p_ptr, mp_ptr, k_val, p_val, mp_val,
                           seed_ptr, off_ptr, seed_val, off_val, seed_stride, off_stride, R, V,
                           stride_row, scratch, MODE: tl.constexpr, HAS_IDX: tl.constexpr,
                           HAS_P: tl.constexpr, P_T: tl.constexpr, MP_T: tl.constexpr,
                           JOINT: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
                           BLOCK: tl.constexpr, G: tl.constexpr, CAP: tl.constexpr,
                           COL: tl.constexpr, PHILOX_ROUNDS: tl.constexpr):
    """``probs [R, V]`` fp32 -> ``out[i]`` int32, ``valid[i]``, for output row ``i`` (row
    ``idx[i]`` with HAS_IDX). MODE 0: plain sampling, one pass. MODE 1: min-p (``mp_val`` or per
    row with MP_T), two passes. MODE 2: top-k ``k_val`` (``1 <= k_val < V``, ``k_val <= G <=
    BLOCK``, ``4 k_val <= BLOCK``: the host checks) then top-p (HAS_P: ``p_val`` or per row with
    P_T), two passes; ``scratch`` fp32, ``CAP`` per output row."""
    i = tl.program_id(0)
    if HAS_IDX:
        row = tl.load(idx_ptr + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    row_ok = (row >= 0) & (row < R)
    safe_row = tl.where(row_ok, row, 0)
    row_ptr = probs + safe_row * stride_row
    k = tl.zeros([], tl.int32) + k_val
    top_p = tl.full([], 1.0, tl.float32)
    if HAS_P:
        if P_T:
            top_p = tl.load(p_ptr + safe_row).to(tl.float32)
        else:
            top_p = top_p * 0.0 + p_val
    p_on = top_p < 1.0

    # pass 1 (MODE 1, 2): the row's sum, maximum and bad flag, and (MODE 2) the lanes' four
    # largest positive values; the next block is loaded before this one is worked on
    lane = tl.arange(0, BLOCK)
    ninf = tl.full([BLOCK], float("-inf"), tl.float32)
    top0 = ninf
    top1 = ninf
    top2 = ninf
    top3 = ninf
    ok = row_ok
    s_all = tl.zeros([], tl.float32)
    rmax = tl.zeros([], tl.float32)
    if MODE != 0:
        total = tl.zeros([BLOCK], tl.float32)
        bad = tl.zeros([BLOCK], tl.int32)
        nxt = tl.load(row_ptr + lane, mask=lane < V, other=0.0)
        for start in range(0, V, BLOCK):
            x = nxt.to(tl.float32)  # masked-off lanes read 0.0: never bad, never positive
            nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V,
                          other=0.0)
            bad |= ((x != x) | (x < 0.0) | (x == float("inf"))).to(tl.int32)
            total += x
            if MODE == 2:
                top0, top1, top2, top3 = _insert(top0, top1, top2, top3,
                                                 tl.where(x > 0.0, x, ninf))
            else:
                top0 = tl.maximum(top0, x)
        s_all = tl.sum(total, axis=0)
        ok = row_ok & (tl.max(bad, axis=0) == 0) & (s_all > 0.0) & (s_all < float("inf"))
        rmax = tl.max(top0, axis=0)

    # between the passes: the keep boundary b (keep positive p >= b), and for top-k tau with
    # the candidates' count at or above it (the proof pass 2 checks)
    tau_o = tl.full([], 2139095040, tl.int64)  # +inf: counts nothing
    n_tau = tl.zeros([], tl.int32)
    b_o = tl.full([], 1, tl.int64)  # the smallest positive float: every positive token
    if MODE == 1:
        if MP_T:
            min_p = tl.load(mp_ptr + safe_row).to(tl.float32)
        else:
            min_p = tl.zeros([], tl.float32) + mp_val
        b_o = tl.maximum(_ord(min_p * rmax), 1).to(tl.int64)
    if MODE == 2:
        tau_o, b_o, n_tau = _top_k_bounds(top0, top1, top2, top3, s_all, rmax, k, top_p, p_on,
                                          scratch, i, JOINT, BLOCK, G, CAP)

    # pass 2: the draw (and for top-k the proof that the candidates held every token >= tau)
    seed, off_lo, off_hi = _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                                      off_stride, i, SEED_T, OFF_T)
    zero = tl.zeros([], tl.uint32)
    r0, _r1, _r2, _r3 = philox(seed, zero, i.to(tl.uint32), 0xFFFF | (off_hi << 16), off_lo,
                               PHILOX_ROUNDS)
    u = uint_to_uniform_float(r0)
    res = tl.zeros([], tl.int32)
    if ok:
        res, n_full, mass, bad_any = _draw(row_ptr, V, _unord(b_o.to(tl.int32)), u,
                                           _unord(tau_o.to(tl.int32)), BLOCK, COL, MODE == 0)
        if MODE == 0:
            ok = ok & (bad_any == 0) & (mass > 0.0) & (mass < float("inf"))
        if MODE == 2:
            if n_full != n_tau:  # a lane held more than four of the top k: exact boundaries
                tau_o, b_o = _exact_top_k_bounds(row_ptr, V, k, top_p, p_on, s_all, rmax,
                                                 JOINT, BLOCK)
                res, n_full, mass, bad_any = _draw(row_ptr, V, _unord(b_o.to(tl.int32)), u,
                                                   _unord(tau_o.to(tl.int32)), BLOCK, COL, False)
    tl.store(out + i, tl.where(ok, tl.maximum(res, 0), 0))
    tl.store(valid + i, ok)
