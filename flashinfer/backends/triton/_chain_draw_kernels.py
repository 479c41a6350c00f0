"""@triton.jit kernel of chain speculative sampling (the Triton backend's
chain_speculative_sampling): per request, the ``n`` accept tests, then the replacement token by
one inverse-CDF draw.

Accept tests (:func:`chain_accept_tests`): draft ``j`` is accepted iff ``u_j q_j < t_j``, with
``u_j`` from Philox counter ``(j, b, 0x100 | offset_hi << 16, offset_lo)``; the first rejected
position ``pos`` ends the chain. Then one pass over the target row at ``pos`` and the draft row
there, summing per block position the residual ``relu(t - d)`` and the target ``t`` (next block
loaded before the current one is worked on). One uniform per request (Philox counter ``(0, b,
0x300 | offset_hi << 16, offset_lo)``) picks the token by the inverse CDF of the residual, or of
the target when the residual is all zero or every draft was accepted, in position-major order
(``_stream_kernels.pick_in_position_major_order``: any fixed order gives the same
distribution). No per-element random numbers: an exponential race over the row (this backend's
first chain kernel) took 2.5-3x as long on the H200.
"""

import triton
import triton.language as tl
from triton.language.random import philox, uint_to_uniform_float

from ._sampling_kernels import _rng_words
from ._stream_kernels import pick_in_position_major_order


@triton.jit
def chain_accept_tests(draft_probs, draft_ids, target_probs, b, n, V, seed, off_lo, off_hi,
                       NPAD: tl.constexpr, PHILOX_ROUNDS: tl.constexpr):
    """Request ``b``'s ``n`` accept tests: draft ``j`` is accepted iff ``u_j q_j < t_j`` (an id
    outside the vocabulary never is). Returns the slots ``j [NPAD]``, the draft ids ``d``, the
    first rejected position ``pos`` (``n`` when none) and the number of accepted drafts."""
    b64 = b.to(tl.int64)
    j = tl.arange(0, NPAD)
    jm = j < n
    d = tl.load(draft_ids + b64 * n + j, mask=jm, other=0).to(tl.int64)
    d_ok = jm & (d >= 0) & (d < V)
    d_c = tl.where(d_ok, d, 0)
    q = tl.load(draft_probs + (b64 * n + j) * V + d_c, mask=d_ok, other=0.0)
    t = tl.load(target_probs + (b64 * (n + 1) + j) * V + d_c, mask=d_ok, other=0.0)
    ju = j.to(tl.uint32)
    u0, _u1, _u2, _u3 = philox(seed, ju, ju * 0 + b.to(tl.uint32),
                               ju * 0 + ((off_hi << 16) | 0x100), ju * 0 + off_lo,
                               PHILOX_ROUNDS)
    acc = d_ok & (uint_to_uniform_float(u0) * q < t)
    pos = tl.minimum(tl.min(tl.where(acc, NPAD, j), axis=0), n)
    return j, d, pos, tl.sum(acc.to(tl.int32), axis=0)


@triton.jit(do_not_specialize=["seed_val", "off_val", "n"])
def chain_one_pass_kernel(draft_probs, draft_ids, target_probs, output, accepted, emitted,
                          seed_ptr, off_ptr, seed_val, off_val, seed_stride, off_stride, n, V,
                          SEED_T: tl.constexpr, OFF_T: tl.constexpr, NPAD: tl.constexpr,
                          BLOCK: tl.constexpr, COL: tl.constexpr, PHILOX_ROUNDS: tl.constexpr):
    """Request ``program_id``: ``draft_probs [B, n, V]``, ``draft_ids [B, n]``, ``target_probs
    [B, n + 1, V]`` fp32 -> ``output [B, n + 1]`` int32; ``accepted`` / ``emitted`` ``[B]``
    int32 incremented."""
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    seed, off_lo, off_hi = _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                                      off_stride, b, SEED_T, OFF_T)
    j, d, pos, n_acc = chain_accept_tests(draft_probs, draft_ids, target_probs, b, n, V, seed,
                                          off_lo, off_hi, NPAD, PHILOX_ROUNDS)
    has_draft = pos < n
    tgt_row = target_probs + (b64 * (n + 1) + pos) * V
    drf_row = draft_probs + (b64 * n + tl.minimum(pos, n - 1)) * V

    # the pass: per block position the residual's and the target's positive mass
    lane = tl.arange(0, BLOCK)
    res_acc = tl.zeros([BLOCK], tl.float32)
    tgt_acc = tl.zeros([BLOCK], tl.float32)
    d_lim = V * has_draft.to(tl.int32)  # no draft row after the last draft
    t_nxt = tl.load(tgt_row + lane, mask=lane < V, other=0.0)
    d_nxt = tl.load(drf_row + lane, mask=lane < d_lim, other=0.0)
    for start in range(0, V, BLOCK):
        tv = t_nxt
        dv = d_nxt
        nxt = start + BLOCK + lane
        t_nxt = tl.load(tgt_row + nxt, mask=nxt < V, other=0.0)
        d_nxt = tl.load(drf_row + nxt, mask=nxt < d_lim, other=0.0)
        r = tv - dv
        res_acc += tl.where(r > 0.0, r, 0.0)
        tgt_acc += tl.where(tv > 0.0, tv, 0.0)
    use_res = tl.sum(res_acc, axis=0) > 0.0  # else the target itself
    acc = tl.where(use_res, res_acc, tgt_acc)
    zero = tl.zeros([], tl.uint32)
    r0, _r1, _r2, _r3 = philox(seed, zero, b.to(tl.uint32), 0x300 | (off_hi << 16), off_lo,
                               PHILOX_ROUNDS)
    target = uint_to_uniform_float(r0) * tl.sum(acc, axis=0)
    tok = pick_in_position_major_order(tgt_row, V, acc, target, 0.0, 0.0, drf_row,
                                       use_res & has_draft, BLOCK, COL, False, True)
    tok = tl.maximum(tok, 0)  # no positive target mass: token 0
    row_out = tl.where(j < pos, d, tl.where(j == pos, tok.to(tl.int64), -1))
    tl.store(output + b64 * (n + 1) + j, row_out.to(tl.int32), mask=j <= n)
    tl.store(accepted + b, tl.load(accepted + b) + n_acc)
    tl.store(emitted + b, tl.load(emitted + b) + pos)
