"""@triton.jit kernels that merge attention states (imported only when a kernel runs).

A state is an output row ``v [D]`` with its base-2 log-sum-exp ``s``; states merge as
``s = log2(sum_i 2^s_i)``, ``v = sum_i 2^(s_i - s) v_i``. One program per row and ``BLOCK_H``
heads (a ``[BLOCK_H, BLOCK_D]`` tile: wide loads, few programs), the head dim walked in
``BLOCK_D``-wide chunks, fp32 throughout, so no head count or head dim is too large. A (row, head) whose states all have ``s = -inf`` (no key seen) gets ``v = 0``,
``s = -inf``; NaN propagates. Every offset is int64.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merge_two_kernel(
    va_ptr, sa_ptr, vb_ptr, sb_ptr, vo_ptr, so_ptr, mask_ptr,
    va_r, va_h, va_d, vb_r, vb_h, vb_d, vo_r, vo_h, vo_d,
    sa_r, sa_h, sb_r, sb_h, so_r, so_h, heads, head_dim,
    HAS_MASK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """``(vo, so) = merge((va, sa), (vb, sb))`` for ``BLOCK_H`` heads of one row; ``vo`` / ``so``
    may be ``va`` / ``sa`` (in place: each chunk is read before it is written). With
    ``HAS_MASK`` a row whose mask entry is 0 is left as it is."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H).to(tl.int64)
    h_ok = h < heads
    if HAS_MASK:
        if tl.load(mask_ptr + row) == 0:
            return
    a = tl.load(sa_ptr + row * sa_r + h * sa_h, mask=h_ok, other=float("-inf"))
    b = tl.load(sb_ptr + row * sb_r + h * sb_h, mask=h_ok, other=float("-inf"))
    top = tl.maximum(a, b)
    empty = top == float("-inf")
    top = tl.where(empty, 0.0, top)
    wa = tl.exp2(a - top)
    wb = tl.exp2(b - top)
    total = wa + wb
    scale = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, total))
    wa = (wa * scale)[:, None]
    wb = (wb * scale)[:, None]
    for start in range(0, head_dim, BLOCK_D):
        d = start + tl.arange(0, BLOCK_D).to(tl.int64)
        inside = h_ok[:, None] & (d < head_dim)[None, :]
        x = tl.load(va_ptr + row * va_r + h[:, None] * va_h + d[None, :] * va_d, mask=inside)
        y = tl.load(vb_ptr + row * vb_r + h[:, None] * vb_h + d[None, :] * vb_d, mask=inside)
        merged = wa * x.to(tl.float32) + wb * y.to(tl.float32)
        tl.store(vo_ptr + row * vo_r + h[:, None] * vo_h + d[None, :] * vo_d,
                 merged.to(vo_ptr.dtype.element_ty), mask=inside)
    lse = tl.where(empty, float("-inf"), top + tl.log2(tl.where(empty, 1.0, total)))
    tl.store(so_ptr + row * so_r + h * so_h, lse, mask=h_ok)


@triton.jit(do_not_specialize=["num_states"])
def merge_many_kernel(
    v_ptr, s_ptr, indptr_ptr, vo_ptr, so_ptr, num_states,
    v_r, v_n, v_h, v_d, s_r, s_n, s_h, vo_r, vo_h, vo_d, so_r, so_h, heads, head_dim,
    HAS_INDPTR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Merge the states of ``BLOCK_H`` heads of a row: ``v [rows, n, H, D]`` / ``s [rows, n,
    H]`` (``num_states`` each), or with ``HAS_INDPTR`` the states ``indptr[row]:indptr[row + 1]``
    of ``v [total, H, D]`` / ``s [total, H]`` (``v_r`` = ``s_r`` = 0, ``v_n`` / ``s_n`` their
    first strides)."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H).to(tl.int64)
    h_ok = h < heads
    first = row * 0
    count = num_states + row * 0
    if HAS_INDPTR:
        first = tl.load(indptr_ptr + row).to(tl.int64)
        count = tl.load(indptr_ptr + row + 1).to(tl.int64) - first
    s_base = s_ptr + row * s_r + h * s_h + first * s_n
    v_base = v_ptr + row * v_r + h[:, None] * v_h + first * v_n
    top = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for i in range(0, count):
        top = tl.maximum(top, tl.load(s_base + i * s_n, mask=h_ok, other=float("-inf")))
    empty = top == float("-inf")
    top = tl.where(empty, 0.0, top)
    total = tl.zeros([BLOCK_H], dtype=tl.float32)
    for i in range(0, count):
        total += tl.exp2(tl.load(s_base + i * s_n, mask=h_ok, other=float("-inf")) - top)
    scale = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, total))
    for start in range(0, head_dim, BLOCK_D):
        d = start + tl.arange(0, BLOCK_D).to(tl.int64)
        inside = h_ok[:, None] & (d < head_dim)[None, :]
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        for i in range(0, count):
            w = tl.exp2(tl.load(s_base + i * s_n, mask=h_ok, other=float("-inf")) - top) * scale
            x = tl.load(v_base + i * v_n + d[None, :] * v_d, mask=inside)
            acc += w[:, None] * x.to(tl.float32)
        tl.store(vo_ptr + row * vo_r + h[:, None] * vo_h + d[None, :] * vo_d,
                 acc.to(vo_ptr.dtype.element_ty), mask=inside)
    lse = tl.where(empty, float("-inf"), top + tl.log2(tl.where(empty, 1.0, total)))
    tl.store(so_ptr + row * so_r + h * so_h, lse, mask=h_ok)
