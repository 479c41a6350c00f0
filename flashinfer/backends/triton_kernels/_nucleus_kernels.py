"""@triton.jit kernel of top-p (nucleus) sampling by rejection rounds of one lean pass each
(variant ``nucleus`` of sampling_from_probs), and the position-major draw it shares.

The nucleus ``N`` is ``{p : mass strictly above p < top_p * total}`` plus the maximum. The
kernel keeps two ordered-int bounds with ``N ⊂ {p > lo}`` and ``{p > hi} ⊂ N`` and proposes
tokens from ``{p > lo}``:

* **Pass 0**: per block position the positive mass, the row's maximum and a bad flag (NaN,
  negative, +inf); a first token ``t`` drawn from the whole row.
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


@triton.jit
def pick_in_position_major_order(row_ptr, V, acc, target, thr, top, BLOCK: tl.constexpr,
                                 COL: tl.constexpr, LOGITS: tl.constexpr):
    """The token where the running weight, in position-major order, first exceeds ``target``:
    the position from the per-position weights ``acc [BLOCK]``, then the token from its column
    (``COL`` at a time). A token's weight: ``exp(x - top)`` (LOGITS), else ``x`` where ``x >
    thr``. When rounding keeps the column below the target: the column's last token with
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
            w = tl.exp(x - top)
        else:
            x = tl.load(row_ptr + offs, mask=j < n_col, other=0.0).to(tl.float32)
            w = tl.where(x > thr, x, 0.0)
        hit = (run + tl.cumsum(w, axis=0) > rest) & (w > 0.0)
        first_hit = tl.min(tl.where(hit, offs, 2147483647), axis=0)
        pick = tl.where((pick < 0) & (first_hit < 2147483647), first_hit, pick)
        last = tl.maximum(last, tl.max(tl.where(w > 0.0, offs, -1), axis=0))
        run += tl.sum(w, axis=0)
    return tl.where(pick >= 0, pick, last)


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
    if HAS_IDX:
        row = tl.load(idx_ptr + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    row_ok = (row >= 0) & (row < R)
    safe_row = tl.where(row_ok, row, 0)
    row_ptr = probs + safe_row * stride_row
    if P_T:
        top_p = tl.load(p_ptr + safe_row).to(tl.float32)
    else:
        top_p = tl.zeros([], tl.float32) + p_val
    seed, off_lo, off_hi = _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                                      off_stride, i, SEED_T, OFF_T)

    # pass 0: positive mass per position, the maximum, the bad flag; the first proposal
    lane = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    mx = tl.zeros([BLOCK], tl.float32)
    bad = tl.zeros([BLOCK], tl.int32)
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=0.0)
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)  # masked-off lanes read 0.0: never bad, never positive
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=0.0)
        bad |= ((x != x) | (x < 0.0) | (x == float("inf"))).to(tl.int32)
        acc += tl.where(x > 0.0, x, 0.0)
        mx = tl.maximum(mx, x)
    total = tl.sum(acc, axis=0)
    ok = row_ok & (tl.max(bad, axis=0) == 0) & (total > 0.0) & (total < float("inf"))
    rmax = tl.max(mx, axis=0)
    bound = top_p * total
    t = pick_in_position_major_order(row_ptr, V, acc, _uniform(seed, 0, i, off_lo, off_hi,
                                                               PHILOX_ROUNDS) * total,
                                     0.0, 0.0, BLOCK, COL, False)
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
                                             u * mass, thr, 0.0, BLOCK, COL, False)
        rnd += 1
    tl.store(out + i, tl.where(ok, tl.maximum(t, 0), 0))
    tl.store(valid + i, ok)
