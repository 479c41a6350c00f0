"""@triton.jit kernel of top-p (nucleus) sampling by rejection rounds of one lean pass each
(variant ``nucleus`` of sampling_from_probs).

The nucleus ``N`` is ``{p : mass strictly above p < top_p * total}`` plus the maximum. The
kernel keeps two ordered-int bounds with ``N ⊂ {p > lo}`` and ``{p > hi} ⊂ N`` and proposes
tokens from ``{p > lo}``:

* **Pass 0**: per block position the positive mass, the row's maximum and a bad flag (NaN,
  negative, +inf: token 0, ``valid = False``, as for a per-row top-p outside [0, 1] or NaN); a
  first token ``t`` drawn from the whole row.
* **Each round**, one pass: per position the masses strictly above ``p_t`` and above ``mid``,
  halfway between ``max(lo, p_t)`` and ``hi`` in the fp32 order. ``t`` is accepted when the
  mass above ``p_t`` is below the bound (or ``p_t`` is the maximum). Otherwise ``N ⊂ {p > p_t}``,
  and ``mid`` halves the bracket: a mass above ``mid`` at or over the bound gives ``lo = mid``,
  else ``hi = mid``; the next ``t`` is drawn from ``{p > lo}`` with the pass's own per-position
  masses. Proposals from a superset of ``N`` accepted only inside it sample ``N`` exactly.

The bracket halves every rejected round, so a row needs at most about 34 rounds; typically one
or two (a draw lands in the nucleus with probability about ``top_p``). Per element and pass:
two comparisons and two masked sums. Draws use the inverse CDF in *position-major* order
(position 0's tokens ``0, BLOCK, 2 BLOCK, ...``, then position 1's, ...): the crossing position
from a cumulative sum over the block, the token from that position's column.

Sums are fp32 (the reference: float64): a token within rounding of the bound may be decided
differently. RNG: Philox4x32 keyed on the seed, counter ``(round, output row, 0xFFFE |
offset_hi << 16, offset_lo)``: one uniform per round.
"""

import triton
import triton.language as tl
from triton.language.random import philox, uint_to_uniform_float

from ._sampling_kernels import _ord, _rng_words, _unord
from ._stream_kernels import first_pass, output_row, pick_in_position_major_order


@triton.jit
def _uniform(seed, rnd, i, off_lo, off_hi, PHILOX_ROUNDS: tl.constexpr):
    zero = tl.zeros([], tl.uint32)
    r0, _r1, _r2, _r3 = philox(seed, zero + rnd, i.to(tl.uint32), 0xFFFE | (off_hi << 16),
                               off_lo, PHILOX_ROUNDS)
    return uint_to_uniform_float(r0)


@triton.jit(do_not_specialize=["p_val", "seed_val", "off_val", "R"])
def nucleus_sample_kernel(probs, out, valid, idx_ptr, p_ptr, p_val, seed_ptr, off_ptr, seed_val,
                          off_val, seed_stride, off_stride, R, V, stride_row,
                          HAS_IDX: tl.constexpr, P_T: tl.constexpr, SEED_T: tl.constexpr,
                          OFF_T: tl.constexpr, BLOCK: tl.constexpr, COL: tl.constexpr,
                          MAX_ROUNDS: tl.constexpr, PHILOX_ROUNDS: tl.constexpr):
    """``probs [R, V]`` fp32 -> ``out[i]`` int32, ``valid[i]``, for output row ``i`` (row
    ``idx[i]`` with HAS_IDX); ``top_p`` scalar ``p_val`` or per row (P_T)."""
    i = tl.program_id(0)
    row_ok, safe_row = output_row(idx_ptr, i, R, HAS_IDX)
    row_ptr = probs + safe_row * stride_row
    if P_T:  # outside [0, 1] (or NaN): the row is invalid (a scalar is host-checked)
        top_p = tl.load(p_ptr + safe_row).to(tl.float32)
        row_ok = row_ok & (top_p >= 0.0) & (top_p <= 1.0)
    else:
        top_p = tl.zeros([], tl.float32) + p_val
    seed, off_lo, off_hi = _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                                      off_stride, i, SEED_T, OFF_T)

    # pass 0: mass per position, the maximum, the bad flag; the first proposal
    lane = tl.arange(0, BLOCK)
    mx, _t1, _t2, _t3, acc, bad = first_pass(row_ptr, V, BLOCK, False, False)
    total = tl.sum(acc, axis=0)
    ok = row_ok & (bad == 0) & (total > 0.0) & (total < float("inf"))
    rmax = tl.max(mx, axis=0)
    bound = top_p * total
    t = pick_in_position_major_order(row_ptr, V, acc, _uniform(seed, 0, i, off_lo, off_hi,
                                                               PHILOX_ROUNDS) * total,
                                     0.0, 0.0, row_ptr, False, BLOCK, COL, False, False)
    lo = tl.zeros([], tl.int64)  # ordered int of 0.0: N within the positive tokens
    hi = _ord(rmax).to(tl.int64)  # nothing above the maximum
    done = tl.where(ok, 0, 1)
    rnd = 1
    while (rnd < MAX_ROUNDS) & (done == 0):
        p_t = tl.load(row_ptr + tl.maximum(t, 0)).to(tl.float32)
        lo_t = tl.maximum(lo, _ord(p_t).to(tl.int64))
        mid = lo_t + (hi - lo_t) // 2
        thr_mid = _unord(mid.to(tl.int32))
        above_t = tl.zeros([BLOCK], tl.float32)
        above_mid = tl.zeros([BLOCK], tl.float32)
        nxt = tl.load(row_ptr + lane, mask=lane < V, other=0.0)
        for start in range(0, V, BLOCK):
            x = nxt.to(tl.float32)
            nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V,
                          other=0.0)
            above_t += tl.where(x > p_t, x, 0.0)
            above_mid += tl.where(x > thr_mid, x, 0.0)
        m_t = tl.sum(above_t, axis=0)
        m_mid = tl.sum(above_mid, axis=0)
        if (m_t < bound) | (p_t == rmax):
            done = done * 0 + 1
        else:
            heavy = m_mid >= bound  # N within {p > mid}
            lo = tl.where(heavy, mid, lo_t)
            hi = tl.where(heavy, hi, mid)
            thr = tl.where(heavy, thr_mid, p_t)
            mass = tl.where(heavy, m_mid, m_t)
            u = _uniform(seed, rnd, i, off_lo, off_hi, PHILOX_ROUNDS)
            t = pick_in_position_major_order(row_ptr, V, tl.where(heavy, above_mid, above_t),
                                             u * mass, thr, 0.0, row_ptr, False, BLOCK, COL,
                                             False, False)
        rnd += 1
    tl.store(out + i, tl.where(ok, tl.maximum(t, 0), 0))
    tl.store(valid + i, ok)
