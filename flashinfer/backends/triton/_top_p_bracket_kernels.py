"""@triton.jit kernel of top-p renormalisation by a shrinking bracket and a sort (variant
``bracket`` of renorm_probs, for top-p).

The kept set is ``{p >= b}``: ``b`` is the smallest token value whose mass strictly above is
below ``P = top_p * sum(p)`` (the row's maximum is always kept). With ``A(t)`` the mass of the
tokens ``>= t``, a bracket ``[lo, hi)`` (ordered ints) holds ``b``: ``A(lo) >= P > A(hi)``.

1. **Pass 1** (``_stream_kernels.first_pass``): the row's sum, maximum and bad flag (NaN,
   negative, +inf: the row comes out zero, as for a per-row top-p outside [0, 1] or NaN). The
   bracket starts as ``[1, ord(max) + 1)``.
2. **Pivot passes**: four pivots spread evenly over the bracket (in the fp32 order, roughly a
   logarithmic scale), the count and mass of the tokens at or above each; the bracket shrinks to
   the pivots around ``P`` (a fifth of it per pass), until it holds at most ``CAP`` tokens or a
   single value (at most 14 passes; one to three for the rows of a 128k vocabulary).
3. **Compaction**: the tokens inside the bracket are written, in row order, to ``CAP`` slots of
   a scratch row and sorted there (``tl.sort``); the mass above each from the exclusive prefix
   sum plus ``A(hi)``, so ``b`` and the kept mass are exact (a single-value bracket wider than
   the slots: one more counting pass for the kept mass).
4. **Write** (``_top_k_two_pass_kernels._write_kept``): ``p / kept mass`` where ``p >= b``,
   else 0.

Sums are float32 (the reference: float64), so a token within rounding of the bound may be
decided differently, as in the other kernels.
"""

import triton
import triton.language as tl

from ._sampling_kernels import _ord, _unord
from ._stream_kernels import count_at_least, first_pass
from ._top_k_two_pass_kernels import _write_kept


@triton.jit
def _above_pivots(row_ptr, V, p0, p1, p2, p3, BLOCK: tl.constexpr):
    """Count and mass of the tokens ``>= p_i`` for four pivots (floats, ascending)."""
    lane = tl.arange(0, BLOCK)
    c0 = tl.zeros([BLOCK], tl.int32)
    c1 = tl.zeros([BLOCK], tl.int32)
    c2 = tl.zeros([BLOCK], tl.int32)
    c3 = tl.zeros([BLOCK], tl.int32)
    m0 = tl.zeros([BLOCK], tl.float32)
    m1 = tl.zeros([BLOCK], tl.float32)
    m2 = tl.zeros([BLOCK], tl.float32)
    m3 = tl.zeros([BLOCK], tl.float32)
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=0.0)
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=0.0)
        c0 += (x >= p0).to(tl.int32)
        c1 += (x >= p1).to(tl.int32)
        c2 += (x >= p2).to(tl.int32)
        c3 += (x >= p3).to(tl.int32)
        m0 += tl.where(x >= p0, x, 0.0)
        m1 += tl.where(x >= p1, x, 0.0)
        m2 += tl.where(x >= p2, x, 0.0)
        m3 += tl.where(x >= p3, x, 0.0)
    return (tl.sum(c0, axis=0), tl.sum(c1, axis=0), tl.sum(c2, axis=0), tl.sum(c3, axis=0),
            tl.sum(m0, axis=0), tl.sum(m1, axis=0), tl.sum(m2, axis=0), tl.sum(m3, axis=0))


@triton.jit
def _narrow(lo, hi, c_lo, c_hi, a_hi, piv, c, a, bound):
    """The bracket after one pivot (ordered int ``piv`` with count ``c`` and mass ``a`` at or
    above it): the pivot becomes ``lo`` if ``a >= bound``, else ``hi`` if it is below ``hi``."""
    up = a >= bound
    new_lo = tl.where(up & (piv > lo), piv, lo)
    new_c_lo = tl.where(up & (piv > lo), c, c_lo)
    down = (~up) & (piv < hi)
    return (new_lo, tl.where(down, piv, hi), new_c_lo, tl.where(down, c, c_hi),
            tl.where(down, a, a_hi))


@triton.jit
def _compact_and_sort(row_ptr, V, lo_f, hi_f, scratch, row, BLOCK: tl.constexpr,
                      CAP: tl.constexpr):
    """The tokens in ``[lo_f, hi_f)`` written in row order to ``CAP`` slots of scratch row
    ``row`` and sorted, largest first (``-inf`` past them); and how many there were."""
    lane = tl.arange(0, BLOCK)
    base = scratch + row.to(tl.int64) * CAP
    n_in = tl.zeros([], tl.int32)
    for start in range(0, V, BLOCK):
        x = tl.load(row_ptr + start + lane, mask=start + lane < V, other=0.0).to(tl.float32)
        inb = ((x >= lo_f) & (x < hi_f)).to(tl.int32)
        slot = n_in + tl.cumsum(inb, axis=0) - inb
        tl.store(base + slot, x, mask=(inb > 0) & (slot < CAP))
        n_in += tl.sum(inb, axis=0)
    tl.debug_barrier()
    c_idx = tl.arange(0, CAP)
    cand = tl.load(base + c_idx, mask=c_idx < n_in, other=float("-inf"))
    return tl.sort(cand, descending=True), n_in


@triton.jit(do_not_specialize=["p_val"])
def top_p_renorm_kernel(src, dst, scratch, p_ptr, p_val, V, stride_src, stride_dst,
                        P_T: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                        MAX_PIVOT_PASSES: tl.constexpr):
    """Row ``program_id`` of probabilities ``src [R, V]`` (fp32/fp16/bf16) -> ``dst`` (its
    dtype), top-p ``p_val`` or per row (P_T); ``scratch`` fp32, ``CAP`` per row."""
    row = tl.program_id(0)
    row_ptr = src + row.to(tl.int64) * stride_src
    out_ptr = dst + row.to(tl.int64) * stride_dst
    p_ok = tl.full([], 1, tl.int32)
    if P_T:  # outside [0, 1] (or NaN): the row comes out zero (a scalar is host-checked)
        top_p = tl.load(p_ptr + row).to(tl.float32)
        p_ok = ((top_p >= 0.0) & (top_p <= 1.0)).to(tl.int32)
    else:
        top_p = tl.zeros([], tl.float32) + p_val
    top0, _t1, _t2, _t3, lane_sums, bad = first_pass(row_ptr, V, BLOCK, False, False)
    s_all = tl.sum(lane_sums, axis=0)
    rmax = tl.max(top0, axis=0)
    ok = (bad == 0) & (s_all > 0.0) & (s_all < float("inf")) & (p_ok != 0)
    bound = top_p * s_all
    m_o = _ord(rmax).to(tl.int64)

    # the bracket [lo, hi) of b: A(lo) >= bound > A(hi); counts at lo and hi (c_lo an upper
    # bound until a pivot lands there)
    lo = tl.full([], 1, tl.int64)
    hi = m_o + 1
    c_lo = tl.zeros([], tl.int32) + V
    c_hi = tl.zeros([], tl.int32)
    a_hi = tl.zeros([], tl.float32)
    search = ok & (top_p < 1.0) & (bound > 0.0)
    passes = tl.zeros([], tl.int32)
    while search & (c_lo - c_hi > CAP) & (hi - lo > 1) & (passes < MAX_PIVOT_PASSES):
        q0 = lo + (hi - lo) // 5
        q1 = lo + 2 * (hi - lo) // 5
        q2 = lo + 3 * (hi - lo) // 5
        q3 = lo + 4 * (hi - lo) // 5
        n0, n1, n2, n3, a0, a1, a2, a3 = _above_pivots(
            row_ptr, V, _unord(q0.to(tl.int32)), _unord(q1.to(tl.int32)),
            _unord(q2.to(tl.int32)), _unord(q3.to(tl.int32)), BLOCK)
        # ascending pivots: lo rises to the last with A >= bound, hi falls to the first below
        lo, hi, c_lo, c_hi, a_hi = _narrow(lo, hi, c_lo, c_hi, a_hi, q3, n3, a3, bound)
        lo, hi, c_lo, c_hi, a_hi = _narrow(lo, hi, c_lo, c_hi, a_hi, q2, n2, a2, bound)
        lo, hi, c_lo, c_hi, a_hi = _narrow(lo, hi, c_lo, c_hi, a_hi, q1, n1, a1, bound)
        lo, hi, c_lo, c_hi, a_hi = _narrow(lo, hi, c_lo, c_hi, a_hi, q0, n0, a0, bound)
        passes += 1

    b_o = tl.where(top_p >= 1.0, 1, m_o)  # keep every positive token, or (top_p = 0) the max
    mass = tl.where(top_p >= 1.0, s_all, 0.0)
    exact_mass = top_p >= 1.0
    if search:
        srt, n_in = _compact_and_sort(row_ptr, V, _unord(lo.to(tl.int32)),
                                      _unord(hi.to(tl.int32)), scratch, row, BLOCK, CAP)
        c_idx = tl.arange(0, CAP)
        w = tl.where(c_idx < n_in, srt, 0.0)
        # the last slot whose mass strictly above is below the bound holds b (the exclusive
        # prefix sum is that mass at the first of a run of ties and only grows along the run)
        under = (a_hi + tl.cumsum(w, axis=0) - w < bound) & (c_idx < n_in)
        last = tl.max(tl.where(under, c_idx, -1), axis=0)
        b_c = tl.min(tl.where(c_idx == last, srt, float("inf")), axis=0)
        b_o = tl.minimum(tl.where(last >= 0, _ord(b_c).to(tl.int64), hi), m_o)
        # kept: the tokens >= hi (mass A(hi)) and the bracket's tokens >= b, all in the slots
        # unless the bracket overflowed them (then a single value: one counting pass)
        mass = a_hi + tl.sum(tl.where(srt >= _unord(b_o.to(tl.int32)), w, 0.0), axis=0)
        exact_mass = n_in <= CAP
    if ok & ~exact_mass:
        _n, mass = count_at_least(row_ptr, V, _unord(b_o.to(tl.int32)), 0.0, BLOCK, False)
    scale = 1.0 / tl.where(mass > 0.0, mass, 1.0)  # an invalid row writes zeros
    _write_kept(row_ptr, out_ptr, V, _unord(b_o.to(tl.int32)), scale, ok, BLOCK, True)
