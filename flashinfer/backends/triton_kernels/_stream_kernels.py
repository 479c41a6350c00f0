"""@triton.jit helpers shared by the row-streaming sampling kernels (``_nucleus_kernels``,
``_renorm_two_pass_kernels``, ``_logits_draw_kernels``): the first pass over a row of
probabilities, the draw by the inverse CDF in position-major order, the output row of a
program."""

import triton
import triton.language as tl

from ._sampling_kernels import _insert


@triton.jit
def first_pass(row_ptr, V, BLOCK: tl.constexpr, TOP4: tl.constexpr):
    """One pass over a row of probabilities: per block position the sum and (TOP4) the four
    largest positive values ``top0 >= top1 >= top2 >= top3``, else only the largest in
    ``top0`` (``-inf`` where none); and whether the row holds a NaN, a negative value or +inf.
    The next block is loaded before this one is worked on."""
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
        x = nxt.to(tl.float32)  # masked-off lanes read 0.0: never bad, never positive
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=0.0)
        bad |= ((x != x) | (x < 0.0) | (x == float("inf"))).to(tl.int32)
        total += x
        pos = tl.where(x > 0.0, x, ninf)
        if TOP4:
            top0, top1, top2, top3 = _insert(top0, top1, top2, top3, pos)
        else:
            top0 = tl.maximum(top0, pos)
    return top0, top1, top2, top3, total, tl.max(bad, axis=0) > 0


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
def output_row(idx_ptr, i, R, HAS_IDX: tl.constexpr):
    """Output ``i``'s input row (``idx[i]`` with HAS_IDX): whether it lies in ``[0, R)``, and
    the row to read (0 when it does not)."""
    if HAS_IDX:
        row = tl.load(idx_ptr + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    row_ok = (row >= 0) & (row < R)
    return row_ok, tl.where(row_ok, row, 0)
