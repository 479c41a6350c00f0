"""@triton.jit kernels of the sampling family (registered in ``sampling.py``). One program per row.

Filtered sampling without sorting: pivot search plus rejection by an exponential race
====================================================================================

Every keep rule of the contract (top-k, top-p, min-p, top-k-first-then-top-p, joint) keeps an
*upper set* of the row: with ``c(t) = #{p > t}`` and ``m(t) = sum{p > t}``, a token of value ``v``
is kept iff ``pred(v)``, ``pred(t) = (c(t) < k) & (m(t) < top_p * S_ref) & (t >= min_p * max)
| (t >= max)``, which is monotone in ``t``. Evaluating ``pred`` at a pivot ``t`` decides a whole
side: true -> every token ``>= t`` is kept; false -> every token ``<= t`` is rejected. The kernel
keeps the bracket ``lo < hi`` (``lo`` rejected, ``hi`` kept; ``0`` and ``max`` after round 0) and
runs *rounds*, each exactly one pass over the row, which

1. counts ``c`` and sums ``m`` above ``NP = 8`` pivots at once: the pending candidate's value,
   three pairs ``(v - 1 ulp, v)`` of sample values ``v`` placed around the boundary, and the
   bracket's midpoint in ordered-int (fp32 bit) space; then moves ``lo`` / ``hi`` to the tightest
   decided pivots. The samples come from the previous pass: per lane a race (weight 1 when the
   boundary is a count, ``p`` when it is a mass) over the tokens inside the bracket; the Q
   winners are ranked by comparison and the order statistics at the boundary's estimated rank
   picked (a Floyd-Rivest style selection);
2. draws a candidate from ``p`` restricted to ``{p > lo}`` (a superset of the kept set) by an
   exponential race: the winner of ``argmax p_i / E_i``, ``E_i = -log(u_i)``, is distributed as
   ``p_i / sum``. The same pass runs the race over ``{p > pivot}`` for every pivot, so the
   candidate comes from the bracket *after* this round's update (that set depends only on the
   data and on pivots fixed before the pass). Its value ``>= hi`` -> accepted; otherwise it is
   *pending*: its value is pivot 0 of the next round, which decides it.

Round 0's sample slots are the grid ``4**j / (4 V)`` (the scale of a normalised row).

Small top-k (``k <= Q / 4``): every pass also keeps each lane's four largest values (insertion by
min / max exchanges). Their ``4 Q`` values hold the row's top k but for a ~1e-5 fraction of rows;
the k-th largest of them and the top-p boundary computed among them replace two of the three
sample pairs, so the next pass decides both boundaries exactly and its draw (the race over
``{p > lo}`` for the new ``lo``) comes from the kept set: top-k-then-top-p in two passes.

The output is the first accepted candidate in round order. Each candidate is drawn with fresh
randomness from a superset of the kept set that depends only on earlier rounds, and it is
accepted iff it is kept, so given acceptance it is distributed exactly as ``p`` renormalised on
the kept set (rejection sampling with an adaptive proposal); pivots only affect the speed.

top-k first, then top-p (``joint=False``) needs ``S_k``, the mass of the top-k set: while it is
unknown the pivots bracket the top-k boundary (``lo_k``, ``hi_k``; count samples) and top-p
pivots stay undecided; ``S_k = m(lo_k)`` once every token above ``lo_k`` is certainly in the top k
(``c(lo_k) <= k``, nothing strictly inside the bracket, or the two ends adjacent in fp32). min-p's
threshold is exact after round 0.

Worst case: the midpoint pivot halves the bracket's ordered-int width (< 2**31) every round, so a
bracket is exact after <= 31 rounds, after which the next draw is accepted. top-k-first resolves
two brackets: <= 1 + 31 + 31 + 2 = 65 rounds (``MAX_ROUNDS = 66``; a fallback pass returning the
arg-max follows, unreachable in exact arithmetic). Measured under the interpreter on softmax of
Gaussian logits, V = 32768: top-p 0.9 and min-p 1-2 passes, top-k 50 then top-p 0.9 1-2 (2-4
before the lanes' top four), top-k 1000 then top-p 1-6 (mean 3.6). No sort, one launch, no host
synchronisation, nothing allocated.

RNG: Philox4x32 (``triton.language.random.philox``, ``PHILOX_ROUNDS`` rounds) keyed on the seed,
with the counter ``(element / 4, output row, round | tag << 8 | offset_hi << 16, offset_lo)``; the
four outputs serve four quarters of a ``4 * Q`` chunk.

The other kernels: ``threshold_kernel`` (renorm_probs, top_k_mask_logits) runs the same pivot
search without draws until the bracket is exact (<= 32 rounds, typically 2-4), then one write
pass; ``softmax_kernel`` two passes (online max/sum, write); ``logits_sample_kernel`` one race pass
(Gumbel-max: ``argmax l_i - log E_i``). Chain speculative sampling: ``_chain_draw_kernels``.

Per-row thresholds are tested where they are loaded (a free check): a top-p / min-p outside
[0, 1] or NaN makes a sampled row invalid (token 0, valid False) and a renormalised row zero; a
temperature that is not a finite number > 0 makes a softmax row zero (flashinfer.sampling.ops's
contract).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.random import philox, uint_to_uniform_float

from ._softmax_kernels import inv_temperature

INT_MAX = tl.constexpr(2147483647)


#: Integer arguments whose values change from call to call (thresholds, seeds, offsets, their
#: strides, the row count). Triton specialises an int argument on its value (== 1, a multiple of
#: 16): a new class means a new compile (~2 s) in the middle of serving, and a value of 1 arrives
#: as a constexpr. These are passed as plain runtime values instead.
_VALUE_ARGS = ["k_val", "p_val", "mp_val", "seed_val", "off_val", "seed_stride", "off_stride", "R"]


@triton.jit
def _quarter(r0, r1, r2, r3, qq: tl.constexpr):
    """The Philox output word that feeds chunk quarter ``qq`` (one Philox call, four quarters)."""
    if qq == 0:
        return r0
    elif qq == 1:
        return r1
    elif qq == 2:
        return r2
    else:
        return r3


@triton.jit
def _load_chunk(row_ptr, start, lane, V, NEG: tl.constexpr, Q: tl.constexpr):
    """The four [Q] quarters of the chunk at ``start`` (``NEG`` past the row's end), as stored."""
    o = start + lane
    x0 = tl.load(row_ptr + o, mask=o < V, other=NEG)
    x1 = tl.load(row_ptr + o + Q, mask=o + Q < V, other=NEG)
    x2 = tl.load(row_ptr + o + 2 * Q, mask=o + 2 * Q < V, other=NEG)
    x3 = tl.load(row_ptr + o + 3 * Q, mask=o + 3 * Q < V, other=NEG)
    return x0, x1, x2, x3


@triton.jit
def _ord(x):
    """fp32 -> int32 whose signed order is the float order (NaN aside)."""
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _unord(o):
    b = tl.where(o < 0, o ^ 0x7FFFFFFF, o)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _pivots(a, b, first, samp, NP: tl.constexpr):
    """[NP] pivots: ``first``, then ``samp`` where it is a number (sample-derived), the last one
    the midpoint of (a, b) in ordered-int space; a NaN slot falls back to an even grid there."""
    j = tl.arange(0, NP)
    oa = _ord(a).to(tl.int64)
    ob = _ord(b).to(tl.int64)
    jb = tl.where(j == NP - 1, NP // 2, j).to(tl.int64)
    bit = _unord((oa + ((ob - oa) * jb) // NP).to(tl.int32))
    piv = tl.where((j < NP - 1) & (samp == samp), samp, bit)
    return tl.where(j == 0, first, piv)


@triton.jit
def _sample_pivots(samp_k, samp_v, a, b, frac, NP: tl.constexpr, Q: tl.constexpr,
                   CH: tl.constexpr):
    """Slots 1..NP-2 of the next round's pivots from this round's sample of the bracket (one race
    winner per lane): (NP - 2) / 2 of its order statistics around fraction ``frac`` from the top,
    about two binomial standard deviations apart (the lane sample is not uniform), each as the
    pair (value one ulp down, value) so that a boundary token met by the sample is decided
    exactly. Other slots, or an empty sample: NaN.
    Only samples inside the (already narrowed) bracket (a, b) count; ``frac`` refers to it.
    Ranks come from [Q, CH] comparisons, CH lanes at a time (no sort)."""
    have = (samp_k >= 0.0) & (samp_v > a) & (samp_v < b)
    v = tl.where(have, samp_v, float("-inf"))
    s = tl.sum(have.to(tl.int32), axis=0)
    above = tl.zeros([Q], tl.int32)                     # samples strictly above each sample
    blocks = tl.reshape(v, [Q // CH, CH])
    row_id = tl.arange(0, Q // CH)
    for b in tl.static_range(Q // CH):
        chunk = tl.sum(tl.where(row_id[:, None] == b, blocks, 0.0), axis=0)
        above += tl.sum((chunk[None, :] > v[:, None]).to(tl.int32), axis=1)
    sf = s.to(tl.float32)
    f = tl.minimum(tl.maximum(frac, 0.0), 1.0)
    sigma = 2.0 * tl.sqrt(sf * f * (1.0 - f)) + 1.0
    j = tl.arange(0, NP)
    pair = (j - 1) // 2
    rank = sf * f + (pair.to(tl.float32) - ((NP - 2) // 2 - 1) * 0.5) * sigma
    rank = tl.minimum(tl.maximum(rank, 0.0), tl.maximum(sf - 1.0, 0.0)).to(tl.int32)
    # the (rank+1)-th largest sample: the smallest one with at most `rank` samples above it
    ok = have[None, :] & (above[None, :] <= rank[:, None])
    pick = tl.min(tl.where(ok, v[None, :], float("inf")), axis=1)
    pb = pick.to(tl.int32, bitcast=True)
    down = tl.where(pb > 0, pb - 1, tl.where(pb == 0, -2147483647, pb + 1))
    pick = tl.where((j % 2) == 1, down.to(tl.float32, bitcast=True), pick)
    return tl.where((j >= 1) & (j <= NP - 2) & (s > 0), pick, float("nan"))


@triton.jit
def _first_pivots(V, NP: tl.constexpr):
    """Round 0's pivot slots 1..NP-2 for probabilities: 4**j / (4 V), the scale of a normalised
    row (any scale stays correct, only the search is slower)."""
    j = tl.arange(0, NP)
    grid = tl.exp2((2 * j - 4).to(tl.float32)) / V
    return tl.where((j >= 1) & (j <= NP - 2), grid, float("nan"))


@triton.jit
def _mid(a, b):
    oa = _ord(a).to(tl.int64)
    ob = _ord(b).to(tl.int64)
    return _unord((oa + (ob - oa) // 2).to(tl.int32))


@triton.jit
def _consume(x, mask, offs, rbits, lo, ta, tb, mass_w, piv, acc_c, acc_m, best_k, best_i,
             pbest_k, pbest_i, samp_k, samp_v, DRAW: tl.constexpr, COUNT: tl.constexpr,
             MASS: tl.constexpr, FILTER: tl.constexpr):
    """Fold one [Q] chunk into the pivot counters, the per-lane race winners over ``{x > lo}``
    and over each ``{x > pivot}`` (DRAW; one key per token), and the per-lane sample of the open
    bracket (ta, tb) (weight x if mass_w else 1). Without FILTER (no keep rule) only the race
    over ``{x > lo}`` runs: the pivots decide nothing."""
    e = -tl.log(uint_to_uniform_float(rbits))
    if FILTER:
        gt = (x[None, :] > piv[:, None]) & mask[None, :]
        if COUNT:
            acc_c += gt.to(tl.int32)
        if MASS:
            acc_m += tl.where(gt, x[None, :], 0.0)
    if DRAW:
        key0 = tl.fdiv(x, e, ieee_rounding=False)
        key = tl.where(mask & (x > lo), key0, -1.0)
        better = key > best_k
        best_k = tl.where(better, key, best_k)
        best_i = tl.where(better, offs, best_i)
        if FILTER:
            pkey = tl.where(gt, key0[None, :], -1.0)
            pbetter = pkey > pbest_k
            pbest_k = tl.where(pbetter, pkey, pbest_k)
            pbest_i = tl.where(pbetter, offs[None, :], pbest_i)
    if FILTER:
        w = tl.where(mass_w != 0, x, 1.0)
        key2 = tl.where(mask & (x > ta) & (x < tb), tl.fdiv(w, e, ieee_rounding=False), -1.0)
        better2 = key2 > samp_k
        samp_k = tl.where(better2, key2, samp_k)
        samp_v = tl.where(better2, x, samp_v)
    return acc_c, acc_m, best_k, best_i, pbest_k, pbest_i, samp_k, samp_v


@triton.jit
def _insert(top0, top1, top2, top3, x):
    """``x`` into each lane's four largest (``top0 >= top1 >= top2 >= top3``): max / min
    exchanges down the sorted four."""
    down = tl.minimum(top0, x)
    top0 = tl.maximum(top0, x)
    nxt = tl.minimum(top1, down)
    top1 = tl.maximum(top1, down)
    down = tl.minimum(top2, nxt)
    top2 = tl.maximum(top2, nxt)
    top3 = tl.maximum(top3, down)
    return top0, top1, top2, top3


@triton.jit
def _row_pass(row_ptr, V, lo, ta, tb, mass_w, piv, seed, c1, c2, c3, NEG: tl.constexpr,
              DRAW: tl.constexpr, COUNT: tl.constexpr, MASS: tl.constexpr,
              FILTER: tl.constexpr, TOP4: tl.constexpr, NP: tl.constexpr, Q: tl.constexpr,
              PHILOX_ROUNDS: tl.constexpr):
    """One read of a row: counts/masses above ``piv``, race winner over ``{x > lo}``, per-lane
    bracket sample, the row's max, sum, count above NEG and a bad flag (NaN or below NEG), and
    (TOP4) each lane's four largest values, ``[Q]`` each, largest first (``mx`` is the first)."""
    acc_c = tl.zeros([NP, Q], tl.int32)
    acc_m = tl.zeros([NP, Q], tl.float32)
    best_k = tl.full([Q], -1.0, tl.float32)
    best_i = tl.zeros([Q], tl.int32)
    pbest_k = tl.full([NP, Q], -1.0, tl.float32)
    pbest_i = tl.zeros([NP, Q], tl.int32)
    samp_k = tl.full([Q], -1.0, tl.float32)
    samp_v = tl.zeros([Q], tl.float32)
    mx = tl.full([Q], float("-inf"), tl.float32)
    top1 = mx
    top2 = mx
    top3 = mx
    sm = tl.zeros([Q], tl.float32)
    npos = tl.zeros([Q], tl.int32)
    bad = tl.zeros([Q], tl.int32)
    lane = tl.arange(0, Q)
    # the four quarters of the next chunk are loaded while this one is consumed (a load in
    # flight per lane and quarter is all that hides memory latency at one program per row)
    x0, x1, x2, x3 = _load_chunk(row_ptr, 0, lane, V, NEG, Q)
    for start in range(0, V, 4 * Q):
        n0, n1, n2, n3 = _load_chunk(row_ptr, start + 4 * Q, lane, V, NEG, Q)
        cnt = (start // 4 + lane).to(tl.uint32)
        r0, r1, r2, r3 = philox(seed, cnt, cnt * 0 + c1, cnt * 0 + c2, cnt * 0 + c3,
                                PHILOX_ROUNDS)
        for qq in tl.static_range(4):
            offs = start + qq * Q + lane
            mask = offs < V
            x = _quarter(x0, x1, x2, x3, qq).to(tl.float32)
            rb = _quarter(r0, r1, r2, r3, qq)
            acc_c, acc_m, best_k, best_i, pbest_k, pbest_i, samp_k, samp_v = _consume(
                x, mask, offs, rb, lo, ta, tb, mass_w, piv, acc_c, acc_m, best_k, best_i,
                pbest_k, pbest_i, samp_k, samp_v, DRAW, COUNT, MASS, FILTER)
            xv = tl.where(mask, x, float("-inf"))
            if TOP4:
                mx, top1, top2, top3 = _insert(mx, top1, top2, top3, xv)
            else:
                mx = tl.maximum(mx, xv)
            sm += tl.where(mask & (x > NEG), x, 0.0)
            npos += (mask & (x > NEG)).to(tl.int32)
            bad |= (mask & ((x != x) | (x < NEG))).to(tl.int32)
        x0, x1, x2, x3 = n0, n1, n2, n3
    c = tl.sum(acc_c, axis=1)
    m = tl.sum(acc_m, axis=1)
    bk = tl.max(best_k, axis=0)
    bi = tl.min(tl.where(best_k == bk, best_i, INT_MAX), axis=0)
    pbk = tl.max(pbest_k, axis=1)
    pbi = tl.min(tl.where(pbest_k == pbk[:, None], pbest_i, INT_MAX), axis=1)
    return (c, m, bk, bi, pbk, pbi, samp_k, samp_v, tl.max(mx, axis=0), tl.sum(sm, axis=0),
            tl.sum(npos, axis=0), tl.max(bad, axis=0), mx, top1, top2, top3)


@triton.jit
def _count_at_least(o0, o1, o2, o3, t):
    """How many of the four [Q] ordered-int candidate arrays are ``>= t``."""
    n = (o0 >= t).to(tl.int32) + (o1 >= t).to(tl.int32) + (o2 >= t).to(tl.int32)
    return tl.sum(n + (o3 >= t).to(tl.int32), axis=0)


@triton.jit
def _mass_above(v0, v1, v2, v3, o0, o1, o2, o3, t):
    """The candidates' mass strictly above the ordered-int threshold ``t``."""
    m = tl.where(o0 > t, v0, 0.0) + tl.where(o1 > t, v1, 0.0) + tl.where(o2 > t, v2, 0.0)
    return tl.sum(m + tl.where(o3 > t, v3, 0.0), axis=0)


@triton.jit
def _top_k_pivots(top0, top1, top2, top3, k, top_p, s_all, k_first, p_on, NP: tl.constexpr,
                  Q: tl.constexpr):
    """Pivot slots 1-4 from the lanes' four largest values (``4 Q`` candidates that, for a small
    ``k``, almost surely hold the row's top k): ``(t - 1 ulp, t)`` for ``t`` the k-th largest
    candidate (the top-k boundary) and ``(v - 1 ulp, v)`` for ``v`` the smallest candidate top-p
    keeps (inside the top k; reference mass: the candidates' top-k mass when top-k comes first,
    else the row's sum). When the candidates do hold the top k, the next pass's counts and masses
    at these pivots decide both boundaries exactly and its draw comes from the kept set. Slots
    that are not usable, and all others: NaN. (Pivots never change the result, only the speed.)

    Both values come from bisections over the fp32 order (32 steps of one [Q] reduction each),
    not from a sort: the same answer, and the kernel compiles as fast as without them."""
    o0 = _ord(top0)
    o1 = _ord(top1)
    o2 = _ord(top2)
    o3 = _ord(top3)
    # t: the largest threshold with at least k candidates at or above it
    lo = tl.full([], -2147483648, tl.int64)  # all 4 Q candidates are >= lo
    hi = tl.full([], 2147483648, tl.int64)   # none is
    for _ in range(32):
        mid = lo + (hi - lo) // 2
        enough = _count_at_least(o0, o1, o2, o3, mid) >= k
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    t_k = _unord(lo.to(tl.int32))
    s_k = tl.sum(tl.where(o0 >= lo, top0, 0.0) + tl.where(o1 >= lo, top1, 0.0)
                 + tl.where(o2 >= lo, top2, 0.0) + tl.where(o3 >= lo, top3, 0.0), axis=0)
    bound = top_p * tl.where(k_first, s_k, s_all)
    # v: the smallest candidate at or above both t and the smallest threshold whose mass above
    # falls below top_p * S_ref
    lo2 = tl.full([], -2147483649, tl.int64)
    hi2 = tl.full([], 2147483647, tl.int64)
    for _ in range(32):
        mid = lo2 + (hi2 - lo2) // 2
        heavy = _mass_above(top0, top1, top2, top3, o0, o1, o2, o3, mid) >= bound
        lo2 = tl.where(heavy, mid, lo2)
        hi2 = tl.where(heavy, hi2, mid)
    cut = tl.maximum(hi2, lo)
    inf = float("inf")
    v_p = tl.min(tl.minimum(tl.minimum(tl.where(o0 >= cut, top0, inf), tl.where(o1 >= cut, top1, inf)),
                            tl.minimum(tl.where(o2 >= cut, top2, inf), tl.where(o3 >= cut, top3, inf))),
                 axis=0)
    j = tl.arange(0, NP)
    val = tl.where(j <= 2, t_k, v_p)
    t_ok = (t_k > float("-inf")).to(tl.int32)
    p_ok = ((p_on != 0) & (v_p < inf) & (v_p > 0.0)).to(tl.int32)
    usable = tl.where(j <= 2, t_ok, p_ok) != 0
    val = tl.where(usable, val, 0.0)
    val = tl.where((j % 2) == 1, _unord(_ord(val) - 1), val)  # one ulp down
    return tl.where((j >= 1) & (j <= 4) & usable, val, float("nan"))


@triton.jit
def _bracket(piv, c, m, decided, keep, lo, clo, mlo, hi, chi, mhi):
    """Move (lo, hi) to the tightest decided pivots; returns lo, c(lo), m(lo), hi, c(hi), m(hi)."""
    lo_c = tl.where(decided & (keep == 0), piv, float("-inf"))
    new_lo = tl.max(lo_c, axis=0)
    up = new_lo > lo
    clo = tl.where(up, tl.max(tl.where(lo_c == new_lo, c, -1), axis=0), clo)
    mlo = tl.where(up, tl.max(tl.where(lo_c == new_lo, m, float("-inf")), axis=0), mlo)
    lo = tl.where(up, new_lo, lo)
    hi_c = tl.where(decided & (keep != 0), piv, float("inf"))
    new_hi = tl.min(hi_c, axis=0)
    down = new_hi < hi
    chi = tl.where(down, tl.max(tl.where(hi_c == new_hi, c, -1), axis=0), chi)
    mhi = tl.where(down, tl.max(tl.where(hi_c == new_hi, m, float("-inf")), axis=0), mhi)
    hi = tl.where(down, new_hi, hi)
    return lo, clo, mlo, hi, chi, mhi


@triton.jit
def _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride, off_stride, i,
               SEED_T: tl.constexpr, OFF_T: tl.constexpr):
    if SEED_T:
        seed = tl.load(seed_ptr + i * seed_stride).to(tl.int64)
    else:
        seed = tl.zeros([], tl.int64) + seed_val  # an int arg equal to 1 arrives as a constexpr
    if OFF_T:
        off = tl.load(off_ptr + i * off_stride).to(tl.int64)
    else:
        off = tl.zeros([], tl.int64) + off_val
    off_lo = (off & 0xFFFFFFFF).to(tl.uint32)
    off_hi = ((off >> 32) & 0xFFFF).to(tl.uint32)
    return seed, off_lo, off_hi


@triton.jit(do_not_specialize=_VALUE_ARGS)
def sample_probs_kernel(probs, out, valid, idx_ptr, k_ptr, p_ptr, mp_ptr, k_val, p_val, mp_val,
                        seed_ptr, off_ptr, seed_val, off_val, seed_stride, off_stride,
                        R, V, stride_row, passes_ptr, COUNT_PASSES: tl.constexpr,
                        HAS_IDX: tl.constexpr, K_T: tl.constexpr, P_T: tl.constexpr,
                        MP_T: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
                        HAS_MP: tl.constexpr, FILTER: tl.constexpr, JOINT: tl.constexpr,
                        SEED_T: tl.constexpr,
                        OFF_T: tl.constexpr, NP: tl.constexpr, CH: tl.constexpr,
                        Q: tl.constexpr, MAX_ROUNDS: tl.constexpr,
                        PHILOX_ROUNDS: tl.constexpr):
    i = tl.program_id(0)
    if HAS_IDX:
        row = tl.load(idx_ptr + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    row_ok = (row >= 0) & (row < R)
    row = tl.where(row_ok, row, 0)
    row_ptr = probs + row * stride_row
    seed, off_lo, off_hi = _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                                      off_stride, i, SEED_T, OFF_T)
    # per-row rules (a rule that keeps everything is switched off); a per-row top-p / min-p
    # outside [0, 1] (or NaN) makes the row invalid: token 0, valid False (scalars: host-checked)
    k = tl.zeros([], tl.int32)
    if HAS_K:
        if K_T:
            k = tl.load(k_ptr + row).to(tl.int32)
        else:
            k = k + k_val
    k_on = (k > 0) & (k < V)
    top_p = tl.full([], 1.0, tl.float32)
    if HAS_P:
        if P_T:
            top_p = tl.load(p_ptr + row).to(tl.float32)
            row_ok = row_ok & (top_p >= 0.0) & (top_p <= 1.0)
        else:
            top_p = top_p * 0.0 + p_val
    p_on = top_p < 1.0
    min_p = tl.zeros([], tl.float32)
    if HAS_MP:
        if MP_T:
            min_p = tl.load(mp_ptr + row).to(tl.float32)
            row_ok = row_ok & (min_p >= 0.0) & (min_p <= 1.0)
        else:
            min_p = min_p + mp_val
    mp_on = min_p > 0.0
    any_on = k_on | p_on | mp_on
    k_first = k_on & p_on & (JOINT == 0)   # top-p over the top-k set: needs S_k
    ZERO = tl.zeros([], tl.float32)
    IZERO = tl.zeros([], tl.int32)
    lo = ZERO                      # combined bracket: <= lo rejected, >= hi kept
    hi = ZERO + float("inf")
    clo = IZERO
    chi = IZERO
    mlo = ZERO
    mhi = ZERO
    lo_k = ZERO                    # top-k bracket
    hi_k = hi
    clo_k = IZERO
    chi_k = IZERO
    mlo_k = ZERO
    mhi_k = ZERO
    k_exact = (k_on == 0).to(tl.int32)
    s_k = ZERO
    s_all = ZERO
    rmax = ZERO + float("inf")
    theta = ZERO
    samp = _first_pivots(V, NP)
    pend = IZERO
    pend_val = ZERO
    pend_idx = IZERO
    done = (row_ok == 0).to(tl.int32)
    ok = row_ok.to(tl.int32)
    res = IZERO
    rnd = IZERO
    while (done == 0) & (rnd < MAX_ROUNDS):
        on_k = k_exact == 0
        ta = tl.where(on_k, lo_k, lo)
        tb = tl.where(on_k, hi_k, hi)
        mass_w = (on_k == 0).to(tl.int32)
        first = tl.where(pend != 0, pend_val, _mid(ta, tb))
        piv = _pivots(ta, tb, first, samp, NP)
        c2 = (rnd.to(tl.uint32) & 0xFF) | (off_hi << 16)
        c, m, bk, bi, pbk, pbi, samp_k, samp_v, mx, sm, npos, bad, t0, t1, t2, t3 = _row_pass(
            row_ptr, V, lo, ta, tb, mass_w, piv, seed, i.to(tl.uint32), c2, off_lo, 0.0,
            True, HAS_K, HAS_P, FILTER, HAS_K, NP, Q, PHILOX_ROUNDS)
        if rnd == 0:
            rmax = mx
            s_all = sm
            theta = min_p * mx
            hi = mx
            hi_k = mx
            clo = npos
            clo_k = npos
            mlo = sm
            mlo_k = sm
            bad_row = (bad != 0) | (sm <= 0.0) | (sm == float("inf")) | (sm != sm)
            ok = tl.where(bad_row, 0, ok)
            done = tl.where(bad_row, 1, done)
            if mp_on:   # min-p's threshold is exact now
                lo = tl.maximum(lo, _unord(_ord(theta) - 1))
                hi = tl.where(k_on | p_on, hi, tl.minimum(hi, theta))
        keep_k = ((k_on == 0) | (c < k)).to(tl.int32)
        lo_k, clo_k, mlo_k, hi_k, chi_k, mhi_k = _bracket(piv, c, m, keep_k >= 0, keep_k, lo_k,
                                                          clo_k, mlo_k, hi_k, chi_k, mhi_k)
        no_inside = (tl.max(samp_k, axis=0) < 0.0) & on_k
        exact_k = (clo_k <= k) | (clo_k == chi_k) | (_ord(hi_k) - _ord(lo_k) <= 1) | no_inside
        s_k = tl.where(k_exact != 0, s_k, mlo_k)
        k_exact = tl.where(exact_k, 1, k_exact)
        s_ref = tl.where(k_first, s_k, s_all)
        keep = (keep_k != 0) & ((p_on == 0) | (m < top_p * s_ref)) & ((mp_on == 0) | (piv >= theta))
        keep = (keep | (piv >= rmax)).to(tl.int32)
        decided = (keep_k == 0) | (k_exact != 0) | (k_first == 0)
        lo, clo, mlo, hi, chi, mhi = _bracket(piv, c, m, decided, keep, lo, clo, mlo, hi, chi,
                                              mhi)
        # next round's sample pivots: rank of the boundary inside the narrowed bracket
        next_k = k_exact == 0
        frac_k = (k - chi_k).to(tl.float32) / tl.maximum(clo_k - chi_k, 1).to(tl.float32)
        frac_p = (top_p * s_ref - mhi) / tl.maximum(mlo - mhi, 1e-30)
        frac = tl.where(next_k, frac_k, frac_p)
        na = tl.where(next_k, lo_k, lo)
        nb = tl.where(next_k, hi_k, hi)
        # the pending candidate (drawn last round) comes first
        p_acc = (pend != 0) & ((pend_val >= hi) | (any_on == 0))
        p_rej = (pend != 0) & (pend_val <= lo)
        res = tl.where(p_acc & (done == 0), pend_idx, res)
        done = tl.where(p_acc, 1, done)
        pend = tl.where(p_acc | p_rej, 0, pend)
        # this round's candidate: the race winner over {p > lo} for the narrowed lo when lo is
        # one of this round's pivots (that set was fixed before the pass read any randomness)
        at_lo = piv == lo
        lo_key = tl.max(tl.where(at_lo, pbk, -1.0), axis=0)
        lo_idx = tl.min(tl.where(at_lo & (pbk == lo_key), pbi, INT_MAX), axis=0)
        use_lo = (tl.max(at_lo.to(tl.int32), axis=0) > 0) & FILTER  # no rule: no pivot race
        bk = tl.where(use_lo, lo_key, bk)
        bi = tl.where(use_lo, lo_idx, bi)
        bi_c = tl.minimum(tl.maximum(bi, 0), V - 1)
        pw = tl.load(row_ptr + bi_c)
        fresh = (done == 0) & (pend == 0) & (bk > 0.0)
        n_acc = fresh & ((pw >= hi) | (any_on == 0))
        n_pend = fresh & (n_acc == 0) & (pw > lo)
        res = tl.where(n_acc, bi_c, res)
        done = tl.where(n_acc, 1, done)
        pend_val = tl.where(n_pend, pw, pend_val)
        pend_idx = tl.where(n_pend, bi_c, pend_idx)
        pend = tl.where(n_pend, 1, pend)
        if done == 0:
            samp = _sample_pivots(samp_k, samp_v, na, nb, frac, NP, Q, CH)
            # small k (<= Q / 4: a lane then holds more than four of the top k with a chance
            # below 1e-5): the lanes' top four place pivots at both boundaries instead of two
            # of the three sample pairs; a larger k keeps the sample pairs (the candidates
            # would miss part of the top k and mislead the search)
            if HAS_K:
                cand = _top_k_pivots(t0, t1, t2, t3, k, top_p, s_all, k_first, p_on, NP, Q)
                samp = tl.where(k_on & (k <= Q // 4) & (cand == cand), cand, samp)
        rnd += 1
    if done == 0:  # round budget spent (not reached in exact arithmetic): a kept arg-max token
        best = tl.full([4 * Q], float("-inf"), tl.float32)
        best_i = tl.zeros([4 * Q], tl.int32)
        for start in range(0, V, 4 * Q):
            offs = start + tl.arange(0, 4 * Q)
            x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf"))
            better = x > best
            best = tl.where(better, x, best)
            best_i = tl.where(better, offs, best_i)
        top = tl.max(best, axis=0)
        res = tl.min(tl.where(best == top, best_i, INT_MAX), axis=0)
    res = tl.where(ok != 0, res, 0)
    tl.store(out + i, res)
    tl.store(valid + i, ok != 0)
    if COUNT_PASSES:  # tests: how many passes over the row the draw took
        tl.store(passes_ptr + i, rnd)


@triton.jit(do_not_specialize=["k_val"])
def threshold_kernel(src, dst, k_ptr, p_ptr, k_val, p_val, V, stride_src, stride_dst,
                     IS_LOGITS: tl.constexpr, NEG: tl.constexpr, HAS_K: tl.constexpr,
                     K_T: tl.constexpr, P_T: tl.constexpr, NP: tl.constexpr, CH: tl.constexpr,
                     Q: tl.constexpr, MAX_ROUNDS: tl.constexpr, PHILOX_ROUNDS: tl.constexpr):
    """renorm_probs (top-k or top-p) and top_k_mask_logits: exact keep bracket, then one write.

    Probabilities: out = p / S_kept on kept, 0 elsewhere. Logits: kept unchanged, others -inf.
    The bracket samples use a fixed seed (the output does not depend on it).
    """
    row = tl.program_id(0).to(tl.int64)
    src_row = src + row * stride_src
    dst_row = dst + row * stride_dst
    k = tl.zeros([], tl.int32)
    top_p = tl.full([], 1.0, tl.float32)
    p_ok = tl.full([], 1, tl.int32)  # a per-row top-p outside [0, 1] (or NaN): a zero row
    if HAS_K:
        if K_T:
            k = tl.load(k_ptr + row).to(tl.int32)
        else:
            k = k + k_val
        on = (k > 0) & (k < V)
    else:
        if P_T:
            top_p = tl.load(p_ptr + row).to(tl.float32)
            p_ok = ((top_p >= 0.0) & (top_p <= 1.0)).to(tl.int32)
        else:
            top_p = top_p * 0.0 + p_val
        on = (top_p < 1.0) & (p_ok != 0)
    if HAS_K:
        mass_w = tl.zeros([], tl.int32)
    else:
        mass_w = tl.full([], 1, tl.int32)
    ZERO = tl.zeros([], tl.float32)
    lo = ZERO + NEG
    hi = ZERO + float("inf")
    clo = tl.zeros([], tl.int32)
    chi = clo
    mlo = ZERO
    mhi = ZERO
    rmax = ZERO + float("inf")
    s_all = ZERO
    if IS_LOGITS:
        samp = tl.full([NP], float("nan"), tl.float32)
    else:
        samp = _first_pivots(V, NP)
    exact = (on == 0).to(tl.int32)
    row_bad = tl.zeros([], tl.int32)  # probabilities: a NaN or negative entry (seen in pass 0)
    rnd = tl.zeros([], tl.int32)
    while (exact == 0) & (rnd < MAX_ROUNDS):
        piv = _pivots(lo, hi, _mid(lo, hi), samp, NP)
        c, m, bk, bi, pbk, pbi, samp_k, samp_v, mx, sm, npos, bad, t0, t1, t2, t3 = _row_pass(
            src_row, V, lo, lo, hi, mass_w, piv, 0x5EED, row.to(tl.uint32),
            rnd.to(tl.uint32), 0, NEG, False, True, not IS_LOGITS, True, HAS_K, NP, Q,
            PHILOX_ROUNDS)
        if rnd == 0:
            row_bad = bad
            rmax = mx
            s_all = sm
            hi = mx
            clo = npos
            mlo = sm
        if HAS_K:
            keep = ((c < k) | (piv >= rmax)).to(tl.int32)
        else:
            keep = ((m < top_p * s_all) | (piv >= rmax)).to(tl.int32)
        lo, clo, mlo, hi, chi, mhi = _bracket(piv, c, m, keep >= 0, keep, lo, clo, mlo, hi, chi,
                                              mhi)
        no_inside = tl.max(samp_k, axis=0) < 0.0
        exact = (no_inside | (clo == chi) | (_ord(hi) - _ord(lo) <= 1)).to(tl.int32)
        if HAS_K:
            exact = tl.where(clo <= k, 1, exact)
        if HAS_K:
            frac = (k - chi).to(tl.float32) / tl.maximum(clo - chi, 1).to(tl.float32)
        else:
            frac = (top_p * s_all - mhi) / tl.maximum(mlo - mhi, 1e-30)
        if exact == 0:
            samp = _sample_pivots(samp_k, samp_v, lo, hi, frac, NP, Q, CH)
            if HAS_K:  # small k: the top-k boundary from the lanes' top four (as in sampling)
                no = k < 0  # false: not top-k first, no top-p
                cand = _top_k_pivots(t0, t1, t2, t3, k, 1.0, s_all, no, no, NP, Q)
                samp = tl.where(on & (k <= Q // 4) & (cand == cand), cand, samp)
        rnd += 1
    # an exhausted budget (not reached in exact arithmetic) keeps {x >= hi}, hi always kept
    cut = tl.where(exact != 0, lo, _unord(_ord(hi) - 1))
    cut = tl.where(on, cut, NEG)
    ok = tl.full([], 1, tl.int32)
    if not IS_LOGITS:
        s_keep = tl.where(on, mlo, s_all)
        if (exact == 0) | (on == 0):
            s_keep = ZERO
            for start in range(0, V, 4 * Q):
                offs = start + tl.arange(0, 4 * Q)
                x = tl.load(src_row + offs, mask=offs < V, other=0.0).to(tl.float32)
                s_keep += tl.sum(tl.where(x > cut, x, 0.0), axis=0)
                row_bad |= tl.max(((x != x) | (x < 0.0)).to(tl.int32), axis=0)
        # an invalid row (NaN, negative entry, kept mass <= 0 or infinite, a bad top-p) comes
        # out all zeros
        ok = ((row_bad == 0) & (s_keep > 0.0) & (s_keep < float("inf"))
              & (p_ok != 0)).to(tl.int32)
        inv = 1.0 / tl.where(ok != 0, s_keep, 1.0)
    for start in range(0, V, 4 * Q):
        offs = start + tl.arange(0, 4 * Q)
        mask = offs < V
        x = tl.load(src_row + offs, mask=mask, other=NEG).to(tl.float32)
        if IS_LOGITS:
            y = tl.where(x > cut, x, float("-inf"))
        else:
            y = tl.where((ok != 0) & (x > cut), x * inv, 0.0)
        tl.store(dst_row + offs, y.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def softmax_kernel(src, dst, t_ptr, t_val, V, stride_src, stride_dst,
                   T_T: tl.constexpr, BLOCK: tl.constexpr):
    """out = softmax((x - max) / T) in fp32: pass 1 online per-lane max of x and rescaled sum,
    pass 2 write; a temperature row that is not a finite number > 0 is written as zeros."""
    row = tl.program_id(0).to(tl.int64)
    inv_t, t_ok = inv_temperature(t_ptr, t_val, row, T_T)
    lane = tl.arange(0, BLOCK)
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + lane
        x = tl.load(src + row * stride_src + offs, mask=offs < V,
                    other=float("-inf")).to(tl.float32)
        new = tl.maximum(mx, x)
        safe = tl.where(new == float("-inf"), 0.0, new)
        s = s * tl.exp((mx - safe) * inv_t) + tl.exp((x - safe) * inv_t)
        mx = new
    top = tl.max(mx, axis=0)
    total = tl.sum(s * tl.exp((mx - top) * inv_t), axis=0)
    inv = 1.0 / total
    for start in range(0, V, BLOCK):
        offs = start + lane
        mask = offs < V
        x = tl.load(src + row * stride_src + offs, mask=mask,
                    other=float("-inf")).to(tl.float32)
        y = tl.where(t_ok, tl.exp((x - top) * inv_t) * inv, 0.0)
        tl.store(dst + row * stride_dst + offs, y, mask=mask)


@triton.jit(do_not_specialize=_VALUE_ARGS[3:])
def logits_sample_kernel(logits, out, idx_ptr, seed_ptr, off_ptr, seed_val, off_val,
                         seed_stride, off_stride, R, V, stride_row,
                         HAS_IDX: tl.constexpr, SEED_T: tl.constexpr, OFF_T: tl.constexpr,
                         Q: tl.constexpr, PHILOX_ROUNDS: tl.constexpr):
    """Gumbel-max in one pass: argmax l_i - log(E_i); NaN or all -inf rows -> 0."""
    i = tl.program_id(0)
    if HAS_IDX:
        row = tl.load(idx_ptr + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    row_ok = (row >= 0) & (row < R)
    row = tl.where(row_ok, row, 0)
    seed, off_lo, off_hi = _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                                      off_stride, i, SEED_T, OFF_T)
    lane = tl.arange(0, Q)
    best_k = tl.full([Q], float("-inf"), tl.float32)
    best_i = tl.zeros([Q], tl.int32)
    bad = tl.zeros([Q], tl.int32)
    c2 = off_hi << 16
    row_ptr = logits + row * stride_row
    x0, x1, x2, x3 = _load_chunk(row_ptr, 0, lane, V, float("-inf"), Q)
    for start in range(0, V, 4 * Q):
        n0, n1, n2, n3 = _load_chunk(row_ptr, start + 4 * Q, lane, V, float("-inf"), Q)
        cnt = (start // 4 + lane).to(tl.uint32)
        r0, r1, r2, r3 = philox(seed, cnt, cnt * 0 + i.to(tl.uint32), cnt * 0 + c2,
                                cnt * 0 + off_lo, PHILOX_ROUNDS)
        for qq in tl.static_range(4):
            rb = _quarter(r0, r1, r2, r3, qq)
            offs = start + qq * Q + lane
            mask = offs < V
            x = _quarter(x0, x1, x2, x3, qq).to(tl.float32)
            key = x - tl.log(-tl.log(uint_to_uniform_float(rb)))
            key = tl.where(mask & (x == x), key, float("-inf"))
            better = key > best_k
            best_k = tl.where(better, key, best_k)
            best_i = tl.where(better, offs, best_i)
            bad |= (mask & (x != x)).to(tl.int32)
        x0, x1, x2, x3 = n0, n1, n2, n3
    bk = tl.max(best_k, axis=0)
    res = tl.min(tl.where(best_k == bk, best_i, INT_MAX), axis=0)
    good = row_ok & (tl.max(bad, axis=0) == 0) & (bk > float("-inf"))
    tl.store(out + i, tl.where(good, res, 0))
