"""@triton.jit kernels for grouped / segment GEMM (imported only when a kernel runs).

Tiles are per segment. The rows ``[0, M)`` are cut into ``S + 2`` pieces: the uncovered head
``[0, indptr[0])``, the ``S`` segments, the uncovered tail ``[indptr[S], M)``; piece ``j`` gets
``cdiv(len_j, BLOCK_M)`` tiles, numbered piece after piece. Program ``(t, n)`` finds the piece
holding tile ``t`` with :func:`_find_tile` (a running sum of the pieces' tile counts over
``indptr`` read on the device, all pieces in one scan), so one launch serves any offsets
without a host sync and a tile never straddles two segments. The grid has
``cdiv(M, BLOCK_M) + S + 2`` tile slots, enough for any valid offsets; slots past the last tile
return at once. Head and tail tiles store zeros (rows no segment covers read as zeros).

Offsets are trusted (not read on the host, CUDA-graph safe): they are clamped to ``[0, M]`` so no
load leaves ``x`` / ``a``; a weight index outside ``[0, num_weights)`` loads nothing and writes
NaN rows. Operands are read through their strides; rows, columns and K past the edge load as
zeros. Row offsets are int64; accumulation is fp32.

* ``segment_gemm_kernel``: ``out[r] = alpha * x[r] @ W[w]`` for ``r`` in segment ``s``,
  ``w = weight_indices[s]`` or ``s``; the weight is addressed by ``(s_wk, s_wn)`` strides so both
  layouts (``[W, K, N]`` and ``[W, N, K]``) are one kernel.
* ``group_gemm_fp8_kernel``: ``out[r] = sum_k a[r, k] b[g, n, k] * a_s[row(r), k // GK] *
  b_s[g, n // GN, k // GK]`` with ``row(r) = s // GM + (r - s) // GM`` for group ``g`` starting
  at ``s``; ``GK`` is a multiple of ``BLOCK_K`` or at least K (one scale per row and column per
  K step: ``acc += dot(a, b) * a_s[:, None] * b_s[None, :]``).

``DOT_F32`` (CPU, Triton's interpreter) upcasts the tiles to fp32 before ``tl.dot``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._gemm_kernels import scaled_k_loop


@triton.jit
def _find_tile(indptr_ptr, S, M, tile, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    """Tile ``tile`` -> (piece j in [0, S + 2), the tile's first row, the piece's first row, the
    piece's end row); j = S + 2 when ``tile`` is past the last tile. Piece j spans rows
    [indptr[j - 1], indptr[j]) with indptr[-1] = 0 and indptr[S + 1] = M, clamped to [0, M].
    ``CHUNK >= S + 2``: every piece in one scan."""
    j = tl.arange(0, CHUNK)
    start = tl.load(indptr_ptr + j - 1, mask=(j >= 1) & (j <= S + 1), other=0)
    end = tl.load(indptr_ptr + j, mask=j <= S, other=M)
    start = tl.minimum(tl.maximum(start.to(tl.int32), 0), M)
    end = tl.minimum(tl.maximum(end.to(tl.int32), 0), M)
    tiles = tl.where(j < S + 2, tl.cdiv(tl.maximum(end - start, 0), BLOCK_M), 0)
    ends = tl.cumsum(tiles, 0)  # running tile count at each piece's end
    done = ends <= tile  # pieces wholly before this tile (a prefix: ``ends`` is sorted)
    piece = tl.sum(done.to(tl.int32), 0)
    before = tl.sum(tl.where(done, tiles, 0), 0)
    # the piece's bounds (scalar loads; the same clamping as above)
    first = tl.load(indptr_ptr + piece - 1, mask=(piece >= 1) & (piece <= S + 1), other=0)
    last = tl.load(indptr_ptr + piece, mask=piece <= S, other=M)
    first = tl.minimum(tl.maximum(first.to(tl.int32), 0), M)
    last = tl.minimum(tl.maximum(last.to(tl.int32), 0), M)
    row0 = first + (tile - before) * BLOCK_M
    return piece, row0, first, tl.maximum(last, first)


@triton.jit
def segment_gemm_kernel(
    x_ptr, w_ptr, indptr_ptr, widx_ptr, alpha_ptr, out_ptr,
    M, N, K, S, W,
    s_xm, s_xk, s_ww, s_wk, s_wn, s_om,
    HAS_WIDX: tl.constexpr, HAS_ALPHA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    CHUNK: tl.constexpr, DOT_F32: tl.constexpr,
):
    piece, row0, _, row_end = _find_tile(indptr_ptr, S, M, tl.program_id(0), BLOCK_M, CHUNK)
    if piece < S + 2:
        rm = row0 + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = rm < row_end
        n_ok = rn < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if (piece >= 1) & (piece <= S):
            seg = piece - 1
            if HAS_WIDX:
                w = tl.load(widx_ptr + seg).to(tl.int64)
            else:
                w = seg.to(tl.int64)
            w_ok = (w >= 0) & (w < W)
            rk = tl.arange(0, BLOCK_K)
            x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_xm
            w_cols = w_ptr + tl.where(w_ok, w, 0) * s_ww + rn.to(tl.int64)[None, :] * s_wn
            wn_ok = n_ok & (tl.zeros([BLOCK_N], dtype=tl.int32) + w_ok.to(tl.int32) != 0)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + rk
                k_ok = kk < K
                x = tl.load(x_rows + kk[None, :] * s_xk, mask=m_ok[:, None] & k_ok[None, :],
                            other=0.0)
                b = tl.load(w_cols + kk.to(tl.int64)[:, None] * s_wk,
                            mask=k_ok[:, None] & wn_ok[None, :], other=0.0)
                if DOT_F32:
                    x = x.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(x, b, acc)
            if HAS_ALPHA:
                acc = acc * tl.load(alpha_ptr)
            acc = tl.where(w_ok, acc, float("nan"))
        out = out_ptr + rm.to(tl.int64)[:, None] * s_om + rn[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def group_gemm_fp8_kernel(
    a_ptr, b_ptr, as_ptr, bs_ptr, indptr_ptr, out_ptr,
    M, N, K, G,
    s_am, s_ak, s_bg, s_bn, s_bk, s_asm, s_ask, s_bsg, s_bsn, s_bsk, s_om,
    GM, GN, GK,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    CHUNK: tl.constexpr, DOT_F32: tl.constexpr,
):
    piece, row0, seg_start, row_end = _find_tile(indptr_ptr, G, M, tl.program_id(0), BLOCK_M,
                                                 CHUNK)
    if piece < G + 2:
        rm = row0 + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = rm < row_end
        n_ok = rn < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if (piece >= 1) & (piece <= G):
            g = (piece - 1).to(tl.int64)
            a_rows = a_ptr + rm.to(tl.int64)[:, None] * s_am
            b_cols = b_ptr + g * s_bg + rn.to(tl.int64)[None, :] * s_bn
            scale_row = seg_start // GM + (rm - seg_start) // GM
            as_rows = as_ptr + scale_row.to(tl.int64) * s_asm
            bs_cols = bs_ptr + g * s_bsg + (rn // GN).to(tl.int64) * s_bsn
            acc = scaled_k_loop(acc, a_rows, b_cols, as_rows, bs_cols, m_ok, n_ok, K, s_ak, s_bk,
                                s_ask, s_bsk, GK, BLOCK_K, DOT_F32)
        out = out_ptr + rm.to(tl.int64)[:, None] * s_om + rn[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
