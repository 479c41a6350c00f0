"""@triton.jit kernels for grouped / segment GEMM (imported only when a kernel runs).

Tiles are per segment. The rows ``[0, M)`` are cut into ``S + 2`` pieces: the uncovered head
``[0, indptr[0])``, the ``S`` segments, the uncovered tail ``[indptr[S], M)``; piece ``j`` gets
``cdiv(len_j, BLOCK_M)`` tiles, numbered piece after piece. Program ``(t, n)`` finds the piece
holding tile ``t`` with :func:`_find_tile` (a running sum of the pieces' tile counts over
``indptr`` read on the device, all pieces in one scan), so one launch serves any offsets
without a host sync and a tile never straddles two segments. The grid has
``cdiv(M, BLOCK_M) + S + 2`` tile slots, enough for any valid offsets; slots past the last tile
return at once. Head and tail tiles store zeros (rows no segment covers read as zeros).

Index checks (the contract of :mod:`flashinfer.index_checks`; nothing read on the host, CUDA-graph
safe): offset entry ``i`` is bad when it is below entry ``i - 1`` (below 0 for entry 0) or above
``M``. The scan uses the offsets up to the first bad entry and replaces that one and every later
one by the last good offset (0 when entry 0 is bad), so the pieces stay disjoint inside
``[0, M]``: the segments before the bad entry are computed, every later row lands in the
zero-filled tail. A weight index outside ``[0, W)`` loads nothing and its segment's rows are
stored as zeros. Program ``(0, 0)`` reports the first bad offset (code ``OFF_CODE``; with
``LENS``, as ``seg_lens[i - 1]`` with the length as value), then the first bad weight index
(``W_CODE``), into the error record ``rec`` (``_fault_kernels.report_fault``). Operands are read
through their strides; rows, columns and K past the edge load as zeros. Row offsets are int64;
accumulation is fp32.

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

from ._fault_kernels import report_fault
from ._gemm_kernels import scaled_k_loop


@triton.jit
def _report_first(rec_ptr, code, bad, entries, values, bound):
    """Report the first ``bad`` lane (its entry and value) under ``code``; the record's count
    (element 3 of ``[code, key, bound, count]``) gets every bad lane (``report_fault`` adds
    one)."""
    count = tl.sum(bad.to(tl.int32), 0)
    if count > 0:
        first = tl.min(tl.where(bad, entries, 2147483647), 0)
        value = tl.sum(tl.where(bad & (entries == first), values, 0), 0)
        report_fault(rec_ptr, code, first, value, bound)
        tl.atomic_add(rec_ptr + 3, (count - 1).to(tl.int64))


@triton.jit
def _find_tile(indptr_ptr, S, M, tile, rec_ptr, OFF_CODE, REPORT, LENS: tl.constexpr,
               BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    """Tile ``tile`` -> (piece j in [0, S + 2), the tile's first row, the piece's first row, the
    piece's end row); j = S + 2 when ``tile`` is past the last tile. Piece j spans rows
    [e[j - 1], e[j]) with e[-1] = 0, e[S + 1] = M and e the guarded offsets (module docstring);
    ``REPORT``: this program reports the first bad offset. ``CHUNK >= S + 2``: every piece in
    one scan."""
    j = tl.arange(0, CHUNK)
    # entry j - 1 (the piece's start) and entry j (its end) of indptr, int64
    start = tl.load(indptr_ptr + j - 1, mask=(j >= 1) & (j <= S + 1), other=0).to(tl.int64)
    end = tl.load(indptr_ptr + j, mask=j <= S, other=0).to(tl.int64)
    bad = (j <= S) & ((end < start) | (end > M))
    if REPORT:
        if LENS:  # seg_indptr = [0, cumsum(seg_lens)]: entry j is seg_lens[j - 1]
            _report_first(rec_ptr, OFF_CODE, bad, j - 1, end - start, M)
        else:
            _report_first(rec_ptr, OFF_CODE, bad, j, end, M)
    cut = tl.min(tl.where(bad, j, CHUNK), 0)  # the first bad entry (CHUNK: none)
    kept = tl.sum(tl.where(j == cut - 1, end, 0), 0)  # the last good offset (0 for cut == 0)
    end = tl.where(j <= S, tl.where(j < cut, end, kept), M)
    start = tl.where(j == 0, 0, tl.where(j - 1 < cut, start, kept))
    tiles = tl.where(j < S + 2, tl.cdiv(tl.maximum(end - start, 0), BLOCK_M), 0).to(tl.int32)
    ends = tl.cumsum(tiles, 0)  # running tile count at each piece's end
    done = ends <= tile  # pieces wholly before this tile (a prefix: ``ends`` is sorted)
    piece = tl.sum(done.to(tl.int32), 0)
    before = tl.sum(tl.where(done, tiles, 0), 0)
    first = tl.sum(tl.where(j == piece, start, 0), 0).to(tl.int32)
    last = tl.sum(tl.where(j == piece, end, 0), 0).to(tl.int32)
    row0 = first + (tile - before) * BLOCK_M
    return piece, row0, first, tl.maximum(last, first)


# the fault codes may be 1: not specialised on their values
@triton.jit(do_not_specialize=["OFF_CODE", "W_CODE"])
def segment_gemm_kernel(
    x_ptr, w_ptr, indptr_ptr, widx_ptr, alpha_ptr, out_ptr, rec_ptr,
    M, N, K, S, W, OFF_CODE, W_CODE,
    s_xm, s_xk, s_ww, s_wk, s_wn, s_om,
    HAS_WIDX: tl.constexpr, HAS_ALPHA: tl.constexpr, LENS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    CHUNK: tl.constexpr, DOT_F32: tl.constexpr,
):
    reporter = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
    piece, row0, _, row_end = _find_tile(indptr_ptr, S, M, tl.program_id(0), rec_ptr, OFF_CODE,
                                         reporter, LENS, BLOCK_M, CHUNK)
    if HAS_WIDX:
        if reporter:
            j = tl.arange(0, CHUNK)
            w_all = tl.load(widx_ptr + j, mask=j < S, other=0).to(tl.int64)
            _report_first(rec_ptr, W_CODE, (j < S) & ((w_all < 0) | (w_all >= W)), j, w_all, W)
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
            w_ok = (w >= 0) & (w < W)  # a bad index: nothing loaded, zero rows stored
            rk = tl.arange(0, BLOCK_K)
            x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_xm
            w_cols = w_ptr + tl.where(w_ok, w, 0) * s_ww + rn.to(tl.int64)[None, :] * s_wn
            wn_ok = rn < tl.where(w_ok, N, 0)
            xm_ok = rm < tl.where(w_ok, row_end, 0)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + rk
                k_ok = kk < K
                x = tl.load(x_rows + kk[None, :] * s_xk, mask=xm_ok[:, None] & k_ok[None, :],
                            other=0.0)
                b = tl.load(w_cols + kk.to(tl.int64)[:, None] * s_wk,
                            mask=k_ok[:, None] & wn_ok[None, :], other=0.0)
                if DOT_F32:
                    x = x.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(x, b, acc)
            if HAS_ALPHA:
                acc = acc * tl.load(alpha_ptr)
        out = out_ptr + rm.to(tl.int64)[:, None] * s_om + rn[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["OFF_CODE"])
def group_gemm_fp8_kernel(
    a_ptr, b_ptr, as_ptr, bs_ptr, indptr_ptr, out_ptr, rec_ptr,
    M, N, K, G, OFF_CODE,
    s_am, s_ak, s_bg, s_bn, s_bk, s_asm, s_ask, s_bsg, s_bsn, s_bsk, s_om,
    GM, GN, GK,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    CHUNK: tl.constexpr, DOT_F32: tl.constexpr,
):
    reporter = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
    piece, row0, seg_start, row_end = _find_tile(indptr_ptr, G, M, tl.program_id(0), rec_ptr,
                                                 OFF_CODE, reporter, False, BLOCK_M, CHUNK)
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
