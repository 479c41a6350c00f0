"""@triton.jit kernel of sampling from logits in one pass (variant ``one_pass`` of
sampling_from_logits).

The general kernel (``_sampling_kernels.logits_sample_kernel``) draws by Gumbel-max: a Philox
word and two logarithms per element. This one reads the row once and needs one exponential per
element: each block position keeps a running maximum and the sum of ``exp(x - max)`` over its
tokens (``_softmax_kernels._online``); rescaled to the row's maximum those sums are the
positions' probability masses. One uniform ``u`` then picks, by the inverse CDF in
*position-major* order (position 0's tokens ``0, BLOCK, 2 BLOCK, ...``, then position 1's, ...),
the position from a cumulative sum over the block and the token within its column (``COL`` at a
time, re-read, exponentials recomputed: ``_stream_kernels.pick_in_position_major_order``). Any
fixed order gives the same distribution.

A row holding a NaN or +inf, or only ``-inf``, gives token 0 (the reference's contract). When
rounding keeps a column's running sum below the target, the column's last token with weight is
drawn.

RNG: Philox4x32 keyed on the seed, counter ``(0, output row, 0xFFFF | offset_hi << 16,
offset_lo)``: one uniform per output row.
"""

import triton
import triton.language as tl
from triton.language.random import philox, uint_to_uniform_float

from ._sampling_kernels import _rng_words
from ._softmax_kernels import _online
from ._stream_kernels import output_row, pick_in_position_major_order


@triton.jit(do_not_specialize=["seed_val", "off_val", "R"])
def logits_draw_kernel(logits, out, idx_ptr, seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                       off_stride, R, V, stride_row, HAS_IDX: tl.constexpr, SEED_T: tl.constexpr,
                       OFF_T: tl.constexpr, BLOCK: tl.constexpr, COL: tl.constexpr,
                       PHILOX_ROUNDS: tl.constexpr):
    """``logits [R, V]`` (fp32/fp16/bf16) -> ``out[i]`` (int32 / int64) for output row ``i``
    (row ``idx[i]`` with HAS_IDX; an index outside ``[0, R)`` gives 0)."""
    i = tl.program_id(0)
    row_ok, safe_row = output_row(idx_ptr, i, R, HAS_IDX)
    row_ptr = logits + safe_row * stride_row

    # the pass: per position the running maximum and sum of exp(x - max), and the bad flag
    lane = tl.arange(0, BLOCK)
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    bad = tl.zeros([BLOCK], tl.int32)
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=float("-inf"))
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V,
                      other=float("-inf"))
        bad |= ((x != x) | (x == float("inf"))).to(tl.int32)
        mx, s = _online(mx, s, x)
    top = tl.max(mx, axis=0)
    ok = row_ok & (tl.max(bad, axis=0) == 0) & (top > float("-inf"))
    acc = tl.where(mx > float("-inf"), s * tl.exp(mx - top), 0.0)

    # the draw: the crossing position, then the token in its column
    seed, off_lo, off_hi = _rng_words(seed_ptr, off_ptr, seed_val, off_val, seed_stride,
                                      off_stride, i, SEED_T, OFF_T)
    zero = tl.zeros([], tl.uint32)
    r0, _r1, _r2, _r3 = philox(seed, zero, i.to(tl.uint32), 0xFFFF | (off_hi << 16), off_lo,
                               PHILOX_ROUNDS)
    target = uint_to_uniform_float(r0) * tl.sum(acc, axis=0)
    res = pick_in_position_major_order(row_ptr, V, acc, target, float("-inf"), top, row_ptr,
                                       False, BLOCK, COL, True, False)
    tl.store(out + i, tl.where(ok, tl.maximum(res, 0), 0).to(out.dtype.element_ty))
