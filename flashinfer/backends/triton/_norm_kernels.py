"""@triton.jit kernels for RMSNorm and LayerNorm (imported only when a kernel runs).

Each program normalises a tile of ``ROWS`` rows by ``BLOCK`` columns, fp32 throughout. With
``SINGLE_PASS`` the whole row fits in one tile (``BLOCK >= hidden``) and is read once; otherwise
``ROWS == 1`` and the row is walked in ``BLOCK``-wide chunks: once to reduce, once more (twice
for LayerNorm) to normalise and store. Row ``r`` of an RMSNorm input ``[B, N, H]`` lives at
``(r // N) * stride_b + (r % N) * stride_n``; the last dim must have stride 1 (the launcher in
``norm.py`` guarantees it). Offsets are int64, so any tensor size is addressable.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_offsets(rows, n_inner, stride_b, stride_n):
    return (rows // n_inner) * stride_b + (rows % n_inner) * stride_n


# n_rows (the token count) changes every call: not specialised on its value, so a batch of one
# token or of 16k tokens does not compile a kernel of its own
@triton.jit(do_not_specialize=["n_rows"])
def rmsnorm_kernel(
    x_ptr, w_ptr, out_ptr, res_ptr,
    n_rows, n_inner, hidden,
    x_sb, x_sn, out_sb, out_sn, res_sb, res_sn,
    eps, weight_bias,
    HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < n_rows)[:, None]
    x_row = _row_offsets(rows, n_inner, x_sb, x_sn)[:, None]
    out_row = _row_offsets(rows, n_inner, out_sb, out_sn)[:, None]
    res_row = _row_offsets(rows, n_inner, res_sb, res_sn)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]

    if SINGLE_PASS:
        mask = row_ok & (cols < hidden)
        v = tl.load(x_ptr + x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + res_row + cols, mask=mask, other=0.0).to(tl.float32)
            summed = (v + r).to(res_ptr.dtype.element_ty)
            tl.store(res_ptr + res_row + cols, summed, mask=mask)
            v = summed.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(v * v, axis=1) / hidden + eps)[:, None]
        w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        y = v * rstd * (w + weight_bias)
        tl.store(out_ptr + out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        for start in range(0, hidden, BLOCK):
            c = start + cols
            mask = row_ok & (c < hidden)
            v = tl.load(x_ptr + x_row + c, mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                r = tl.load(res_ptr + res_row + c, mask=mask, other=0.0).to(tl.float32)
                summed = (v + r).to(res_ptr.dtype.element_ty)
                tl.store(res_ptr + res_row + c, summed, mask=mask)
                v = summed.to(tl.float32)
            acc += v * v
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / hidden + eps)[:, None]
        if HAS_RESIDUAL:
            tl.debug_barrier()  # the residual just stored is re-read below
        for start in range(0, hidden, BLOCK):
            c = start + cols
            mask = row_ok & (c < hidden)
            if HAS_RESIDUAL:
                v = tl.load(res_ptr + res_row + c, mask=mask, other=0.0).to(tl.float32)
            else:
                v = tl.load(x_ptr + x_row + c, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c, mask=c < hidden, other=0.0).to(tl.float32)
            y = v * rstd * (w + weight_bias)
            tl.store(out_ptr + out_row + c, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows"])
def layernorm_kernel(
    x_ptr, g_ptr, b_ptr, out_ptr,
    n_rows, hidden, x_stride, out_stride, eps,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, SINGLE_PASS: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < n_rows)[:, None]
    x_row = (rows * x_stride)[:, None]
    out_row = (rows * out_stride)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]

    if SINGLE_PASS:
        mask = row_ok & (cols < hidden)
        x = tl.load(x_ptr + x_row + cols, mask=mask, other=0.0).to(tl.float32)
        mean = (tl.sum(x, axis=1) / hidden)[:, None]
        centred = tl.where(mask, x - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(centred * centred, axis=1) / hidden + eps)[:, None]
        g = tl.load(g_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        y = centred * rstd * g + b
        tl.store(out_ptr + out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        for start in range(0, hidden, BLOCK):
            c = start + cols
            acc += tl.load(x_ptr + x_row + c, mask=row_ok & (c < hidden), other=0.0).to(tl.float32)
        mean = (tl.sum(acc, axis=1) / hidden)[:, None]
        acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        for start in range(0, hidden, BLOCK):
            c = start + cols
            mask = row_ok & (c < hidden)
            x = tl.load(x_ptr + x_row + c, mask=mask, other=0.0).to(tl.float32)
            centred = tl.where(mask, x - mean, 0.0)
            acc += centred * centred
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / hidden + eps)[:, None]
        for start in range(0, hidden, BLOCK):
            c = start + cols
            mask = row_ok & (c < hidden)
            x = tl.load(x_ptr + x_row + c, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + c, mask=c < hidden, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + c, mask=c < hidden, other=0.0).to(tl.float32)
            y = (x - mean) * rstd * g + b
            tl.store(out_ptr + out_row + c, y.to(out_ptr.dtype.element_ty), mask=mask)
