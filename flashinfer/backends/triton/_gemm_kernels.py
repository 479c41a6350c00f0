"""@triton.jit kernels for fp8 GEMM (imported only when a kernel runs).

Both kernels compute one ``BLOCK_M x BLOCK_N`` output tile per program, walking K in
``BLOCK_K``-wide steps with fp32 accumulation; tiles are visited in groups of ``GROUP_M`` tile
rows so that programs running together share their B tiles in L2. Operands are read through
their strides (any layout); rows, columns and K past the edge are loaded as zeros, so partial
tiles and partial scale blocks need no special case. Row offsets are int64.

* ``gemm_fp8_groupwise_kernel``: ``a [M, K]``, ``b [N, K]``; scale ``a_s[m // GM, k // GK]``
  and ``b_s[n // GN, k // GK]``. ``GK`` is a multiple of ``BLOCK_K`` or at least K, so each
  K-step sees one scale per row and one per column: the step's product is scaled then added,
  ``acc += dot(a, b) * a_s[:, None] * b_s[None, :]``.
* ``bmm_fp8_kernel``: ``A [Bt, M, K]``, ``B [Bt, K, N]`` (batch on grid axis 1), per-tensor
  scales read from the device once, after the K loop: ``out = dot(A, B) * a_s * b_s``.

The products run on fp8 tensor cores (SM 8.9+); ``DOT_F32`` (CPU, Triton's interpreter) upcasts
the tiles to fp32 first. Products of two fp8 values are exact in fp32 either way.

``M`` is not specialised on (``do_not_specialize``): a serving engine's M changes every step, and
Triton would otherwise compile each kernel again for M = 1 and for M not a multiple of 16; M
only bounds the rows and places the tiles, so one compile per tile height serves every M (what
``flashinfer warmup`` compiles).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_coords(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """Program id -> (tile row, tile column), ``GROUP_M`` tile rows per column sweep."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def scaled_k_loop(acc, a_rows, b_cols, as_rows, bs_cols, m_ok, n_ok, K, s_ak, s_bk, s_ask, s_bsk,
                  GK, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr):
    """``acc += dot(a, b) * a_s[:, None] * b_s[None, :]`` over K in ``BLOCK_K`` steps, one scale
    per row and column per step (``k // GK``); ``a_rows [BLOCK_M, 1]`` / ``b_cols [1, BLOCK_N]``
    point at the tile's rows / columns, ``as_rows`` / ``bs_cols`` at their scale rows / columns.
    Shared with the grouped kernel (``_gemm_grouped_kernels``)."""
    rk = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        a = tl.load(a_rows + kk[None, :] * s_ak, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_cols + kk[:, None] * s_bk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        kb = k0 // GK
        sa = tl.load(as_rows + kb * s_ask, mask=m_ok, other=0.0)
        sb = tl.load(bs_cols + kb * s_bsk, mask=n_ok, other=0.0)
        if DOT_F32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
    return acc


@triton.jit(do_not_specialize=["M"])
def gemm_fp8_groupwise_kernel(
    a_ptr, b_ptr, as_ptr, bs_ptr, out_ptr,
    M, N, K,
    s_am, s_ak, s_bn, s_bk, s_asm, s_ask, s_bsn, s_bsk, s_om,
    GM, GN, GK,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * s_am
    b_cols = b_ptr + rn.to(tl.int64)[None, :] * s_bn
    as_rows = as_ptr + (rm // GM).to(tl.int64) * s_asm
    bs_cols = bs_ptr + (rn // GN).to(tl.int64) * s_bsn

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = scaled_k_loop(acc, a_rows, b_cols, as_rows, bs_cols, m_ok, n_ok, K, s_ak, s_bk, s_ask,
                        s_bsk, GK, BLOCK_K, DOT_F32)

    out = out_ptr + rm.to(tl.int64)[:, None] * s_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["M"])
def bmm_fp8_kernel(
    a_ptr, b_ptr, as_ptr, bs_ptr, out_ptr,
    M, N, K,
    s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_ob, s_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    a_rows = a_ptr + batch * s_ab + rm.to(tl.int64)[:, None] * s_am
    b_cols = b_ptr + batch * s_bb + rn.to(tl.int64)[None, :] * s_bn

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        a = tl.load(a_rows + kk[None, :] * s_ak, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_cols + kk[:, None] * s_bk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_F32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)

    acc = acc * (tl.load(as_ptr) * tl.load(bs_ptr))
    out = out_ptr + batch * s_ob + rm.to(tl.int64)[:, None] * s_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
