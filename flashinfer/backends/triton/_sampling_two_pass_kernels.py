"""@triton.jit kernel of the two-pass sampler (variant ``two_pass`` of sampling_from_probs).

Why a second kernel: the general one (``_sampling_kernels``) needs only one or two passes over a
row for top-k 50 then top-p 0.9, but does much work per element in each (eight pivot counts and
masses, eight race trackers, top-four tracking, Philox and a logarithm): on the H200 it took
604 us at 256 x 128k where upstream FlashInfer took 137
(benchmarks/results/sampling_quick_topktopp_h200_2026-11-30_1028utc.json,
sampling_upstream_0.7.2_aot_h200_2026-11-30_1027utc.json). This
kernel does little per element, one program per row reading ``BLOCK`` elements a step, for three
common cases (MODE, chosen on the host):

* MODE 0, plain sampling: pass 2 alone (one pass over the row).
* MODE 1, min-p: pass 1 for the maximum, then pass 2 with ``b = min_p * max``.
* MODE 2, a small top-k (``1 <= k <= BLOCK / 4``) with or without top-p (top-k first or
  joint): all of the steps below. With LOGITS (top-k first only) the row holds logits and a
  token's weight is ``exp(x - max)`` in place of its probability: top-k and top-k-first top-p
  need only the top-k tokens' weights, so no softmax is written (variant ``two_pass`` of
  top_k_top_p_sampling_from_logits).

1. **Pass 1**: the row's sum, maximum and a bad flag (NaN, negative, infinite), and (MODE 2)
   per position of the block the four largest positive values (min / max exchanges). A row that
   is not a distribution gives token 0 and ``valid = False``, as the contract says; so does a
   per-row top-p or min-p outside [0, 1] (or NaN), tested where it is loaded, and an empty kept
   set (no kept mass in pass 2).
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
   passes (bisection over the fp32 order: at most 32 + 32 counting passes), then pass 2 is
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

from ._sampling_kernels import _ord, _rng_words, _unord
from ._stream_kernels import (FINITE_FLOOR, candidates_tau, count_at_least, exact_tau, first_pass,
                              output_row, pick_in_position_major_order)


@triton.jit
def _draw(row_ptr, V, thr, u, tau, top, BLOCK: tl.constexpr, COL: tl.constexpr,
          CHECK: tl.constexpr, LOGITS: tl.constexpr):
    """The inverse-CDF draw at ``u`` (in [0, 1)) over the tokens ``x > thr`` in *position-major*
    order (``_stream_kernels.pick_in_position_major_order``), a token's weight its probability
    ``x`` (``thr >= 0``) or, for LOGITS, ``exp(x - top)``. Returns the token (-1 when none has
    weight), the count of tokens ``>= tau`` (probabilities: positive ones), the kept weight, and
    (CHECK) whether the row holds a NaN, a negative value or +inf."""
    lane = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    cnt = tl.zeros([BLOCK], tl.int32)
    bad = tl.zeros([BLOCK], tl.int32)
    other = float("-inf") if LOGITS else 0.0  # masked-off lanes: no weight, never bad
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=other)
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=other)
        if CHECK:
            bad |= ((x != x) | (x < 0.0) | (x == float("inf"))).to(tl.int32)
        if LOGITS:
            cnt += (x >= tau).to(tl.int32)
            acc += tl.where(x > thr, tl.exp(x - top), 0.0)
        else:
            cnt += ((x >= tau) & (x > 0.0)).to(tl.int32)
            acc += tl.where(x > thr, x, 0.0)
    mass = tl.sum(acc, axis=0)
    res = pick_in_position_major_order(row_ptr, V, acc, u * mass, thr, top, row_ptr, False,
                                       BLOCK, COL, LOGITS, False)
    return res, tl.sum(cnt, axis=0), mass, tl.max(bad, axis=0) > 0


@triton.jit
def _top_p_boundary(srt, w, tau_o, s_k, s_all, rmax, top_p, JOINT: tl.constexpr,
                    CAP: tl.constexpr):
    """The keep boundary ``b`` (an ordered int) of top-p over the sorted candidates ``srt``
    (weights ``w``, in the same order): the smallest candidate ``>= tau`` whose weight strictly
    above is below ``top_p`` times the top-k weight ``s_k`` (JOINT: the row's sum ``s_all``);
    the row's maximum ``rmax`` is always kept. The sorted order's exclusive prefix sum is that
    weight at the first of a run of ties and only grows along the run, so the last slot under
    the bound holds ``b``."""
    c_idx = tl.arange(0, CAP)
    bound = top_p * tl.where(JOINT == 0, s_k, s_all)
    under = (tl.cumsum(w, axis=0) - w < bound) & (_ord(srt) >= tau_o)
    b = tl.min(tl.where(c_idx == tl.max(tl.where(under, c_idx, -1), axis=0), srt,
                        float("inf")), axis=0)  # none under it (top_p = 0): the max only
    return tl.minimum(tl.maximum(_ord(b).to(tl.int64), tau_o), _ord(rmax).to(tl.int64))


@triton.jit
def _exact_top_k_bounds(row_ptr, V, k, top_p, p_on, s_all, rmax, floor_o, JOINT: tl.constexpr,
                        BLOCK: tl.constexpr, LOGITS: tl.constexpr):
    """``tau`` and ``b`` (ordered ints) from full passes: bisection over the fp32 order, at most
    32 + 32 counting passes. ``floor_o``: the least value that counts (ordered int)."""
    tau_o = exact_tau(row_ptr, V, k, floor_o, BLOCK)
    b_o = tau_o
    if p_on:
        _n, s_k = count_at_least(row_ptr, V, _unord(tau_o.to(tl.int32)), rmax, BLOCK, LOGITS)
        bound = top_p * tl.where(JOINT == 0, s_k, s_all)
        lo2 = tau_o - 1  # weight above lo2 >= bound (or lo2 below tau)
        hi2 = tl.full([], 2139095040, tl.int64)
        for _ in range(32):
            mid = lo2 + (hi2 - lo2) // 2
            _c, above = count_at_least(row_ptr, V, _unord((mid + 1).to(tl.int32)), rmax, BLOCK,
                                       LOGITS)
            lo2 = tl.where(above >= bound, mid, lo2)
            hi2 = tl.where(above >= bound, hi2, mid)
        b_o = tl.minimum(tl.maximum(hi2, tau_o), _ord(rmax).to(tl.int64))
    return tau_o, b_o


@triton.jit(do_not_specialize=["k_val", "p_val", "mp_val", "seed_val", "off_val", "R"])
def two_pass_sample_kernel(probs, out, valid, idx_ptr, p_ptr, mp_ptr, k_val, p_val, mp_val,
                           seed_ptr, off_ptr, seed_val, off_val, seed_stride, off_stride, R, V,
                           stride_row, scratch, MODE: tl.constexpr, HAS_IDX: tl.constexpr,
                           HAS_P: tl.constexpr, P_T: tl.constexpr, MP_T: tl.constexpr,
                           JOINT: tl.constexpr, LOGITS: tl.constexpr, SEED_T: tl.constexpr,
                           OFF_T: tl.constexpr,
                           BLOCK: tl.constexpr, G: tl.constexpr, CAP: tl.constexpr,
                           COL: tl.constexpr, PHILOX_ROUNDS: tl.constexpr):
    """``probs [R, V]`` fp32 -> ``out[i]`` int32, ``valid[i]``, for output row ``i`` (row
    ``idx[i]`` with HAS_IDX). MODE 0: plain sampling, one pass. MODE 1: min-p (``mp_val`` or per
    row with MP_T), two passes. MODE 2: top-k ``k_val`` (``1 <= k_val < V``, ``k_val <= G <=
    BLOCK``, ``4 k_val <= BLOCK``: the host checks) then top-p (HAS_P: ``p_val`` or per row with
    P_T), two passes; ``scratch`` fp32, ``CAP`` per output row. LOGITS (MODE 2, JOINT 0 only):
    ``probs`` holds logits (fp32/fp16/bf16) and the draw is from their softmax, a token's weight
    ``exp(x - max)``; a row with a NaN or +inf, or no finite logit, is invalid."""
    i = tl.program_id(0)
    row_ok, safe_row = output_row(idx_ptr, i, R, HAS_IDX)
    row_ptr = probs + safe_row * stride_row
    k = tl.zeros([], tl.int32) + k_val
    # per-row thresholds: outside [0, 1] (or NaN) the row is invalid (scalars: host-checked)
    top_p = tl.full([], 1.0, tl.float32)
    if HAS_P:
        if P_T:
            top_p = tl.load(p_ptr + safe_row).to(tl.float32)
            row_ok = row_ok & (top_p >= 0.0) & (top_p <= 1.0)
        else:
            top_p = top_p * 0.0 + p_val
    p_on = top_p < 1.0
    min_p = tl.zeros([], tl.float32)
    if MODE == 1:
        if MP_T:
            min_p = tl.load(mp_ptr + safe_row).to(tl.float32)
            row_ok = row_ok & (min_p >= 0.0) & (min_p <= 1.0)
        else:
            min_p = min_p + mp_val

    # pass 1 (MODE 1, 2): the row's sum, maximum and bad flag, and (MODE 2) the lanes' four
    # largest positive values
    ok = row_ok
    s_all = tl.zeros([], tl.float32)
    rmax = tl.zeros([], tl.float32)
    ninf = tl.full([BLOCK], float("-inf"), tl.float32)
    top0 = ninf
    top1 = ninf
    top2 = ninf
    top3 = ninf
    if MODE != 0:
        top0, top1, top2, top3, total, bad = first_pass(row_ptr, V, BLOCK, MODE == 2, LOGITS)
        rmax = tl.max(top0, axis=0)
        if LOGITS:
            ok = row_ok & (bad == 0) & (rmax > float("-inf"))
        else:
            s_all = tl.sum(total, axis=0)
            ok = row_ok & (bad == 0) & (s_all > 0.0) & (s_all < float("inf"))

    # between the passes: the keep boundary b (keep positive p >= b), and for top-k tau with
    # the candidates' count at or above it (the proof pass 2 checks)
    tau_o = tl.full([], 2139095040, tl.int64)  # +inf: counts nothing
    n_tau = tl.zeros([], tl.int32)
    b_o = tl.full([], 1, tl.int64)  # the smallest positive float: every positive token
    if MODE == 1:
        b_o = tl.maximum(_ord(min_p * rmax), 1).to(tl.int64)
    floor_o = FINITE_FLOOR if LOGITS else 1  # the least value that counts
    if MODE == 2:
        tau_o, n_tau, s_k, srt = candidates_tau(top0, top1, top2, top3, k, floor_o, scratch, i,
                                                BLOCK, G, CAP)
        b_o = tau_o
        if p_on:
            if LOGITS:  # weights exp(x - max); the top-k weight from the sorted candidates
                w = tl.exp(srt - rmax)
                s_k = tl.sum(tl.where(_ord(srt) >= tau_o, w, 0.0), axis=0)
            else:
                w = tl.where(srt > 0.0, srt, 0.0)
            b_o = _top_p_boundary(srt, w, tau_o, s_k, s_all, rmax, top_p, JOINT, CAP)

    # pass 2: the draw (and for top-k the proof that the candidates held every token >= tau)
    seed, off_lo, off_hi = _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                                      off_stride, i, SEED_T, OFF_T)
    zero = tl.zeros([], tl.uint32)
    r0, _r1, _r2, _r3 = philox(seed, zero, i.to(tl.uint32), 0xFFFF | (off_hi << 16), off_lo,
                               PHILOX_ROUNDS)
    u = uint_to_uniform_float(r0)
    res = tl.zeros([], tl.int32)
    if ok:
        res, n_full, mass, bad_any = _draw(row_ptr, V, _unord((b_o - 1).to(tl.int32)), u,
                                           _unord(tau_o.to(tl.int32)), rmax, BLOCK, COL,
                                           MODE == 0, LOGITS)
        if MODE == 0:
            ok = ok & (bad_any == 0) & (mass > 0.0) & (mass < float("inf"))
        if MODE == 2:
            if n_full != n_tau:  # a lane held more than four of the top k: exact boundaries
                tau_o, b_o = _exact_top_k_bounds(row_ptr, V, k, top_p, p_on, s_all, rmax,
                                                 floor_o, JOINT, BLOCK, LOGITS)
                res, n_full, mass, bad_any = _draw(row_ptr, V, _unord((b_o - 1).to(tl.int32)),
                                                   u, _unord(tau_o.to(tl.int32)), rmax, BLOCK,
                                                   COL, False, LOGITS)
        ok = ok & (mass > 0.0)  # an empty kept set is never a valid draw
    tl.store(out + i, tl.where(ok, tl.maximum(res, 0), 0))
    tl.store(valid + i, ok)
