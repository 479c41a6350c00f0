"""@triton.jit kernel of the one-shot fused all-reduce (imported only when it runs).

One program per token row. It reads the row from every rank's symmetric buffer (``peers``: the
int64 addresses of the ``WORLD`` buffers, this rank's among them), sums them in fp32 in rank
order (0, 1, ..., so every rank computes the same bits), then, as the constexpr flags say:
stores the sum; adds the residual and stores it rounded to the dtype; RMS-normalises that
rounded residual with ``gamma + weight_bias``; stores the normed row rounded to the dtype; and
quantises the rounded normed row to float8_e4m3fn (codes clamped to +-448, rounded to nearest
even): ``QUANT`` 1 multiplies by ``inv_scale`` (a float), 2 by the fp32 reciprocal of
``scale_ptr[0]``, 3 divides by the row's own scale ``max(amax / 448, min_scale)``, stored to
``scale_out_ptr[row]``; with ``ROUND_FP8`` (the interpreter, whose fp8 conversion rounds some
values wrongly) the codes are rounded by arithmetic first. Pointers a flag leaves unused are
placeholders. Rows are contiguous, ``hidden`` elements each; offsets are int64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._moe_kernels import _round_e4m3


@triton.jit(do_not_specialize=["offset"])
def one_shot_kernel(
    peers, buffer_ptr, offset,
    out_ptr, res_in_ptr, res_out_ptr, gamma_ptr, norm_ptr, q_ptr, scale_ptr, scale_out_ptr,
    hidden, eps, weight_bias, inv_scale, min_scale,
    WORLD: tl.constexpr, BLOCK: tl.constexpr, WRITE_SUM: tl.constexpr, RESIDUAL: tl.constexpr,
    WRITE_NORM: tl.constexpr, QUANT: tl.constexpr, ROUND_FP8: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    at = row * hidden + cols
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):
        base = tl.load(peers + r).to(tl.pointer_type(buffer_ptr.dtype.element_ty))
        total += tl.load(base + offset + at, mask=mask, other=0.0).to(tl.float32)
    if WRITE_SUM:
        tl.store(out_ptr + at, total.to(out_ptr.dtype.element_ty), mask=mask)
    if RESIDUAL:
        kept = res_out_ptr.dtype.element_ty
        summed = (total + tl.load(res_in_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(kept)
        tl.store(res_out_ptr + at, summed, mask=mask)
        v = summed.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(v * v, axis=0) / hidden + eps)
        w = tl.load(gamma_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = (v * rstd * (w + weight_bias)).to(kept)
        if WRITE_NORM:
            tl.store(norm_ptr + at, y, mask=mask)
        if QUANT > 0:
            yf = y.to(tl.float32)
            if QUANT == 1:
                scaled = yf * inv_scale
            elif QUANT == 2:
                scaled = yf * tl.math.div_rn(1.0, tl.load(scale_ptr).to(tl.float32))
            else:
                s = tl.maximum(tl.math.div_rn(tl.max(tl.abs(yf), axis=0), 448.0), min_scale)
                tl.store(scale_out_ptr + row, s)
                scaled = tl.math.div_rn(yf, s)
            scaled = tl.clamp(scaled, -448.0, 448.0)
            if ROUND_FP8:
                scaled = _round_e4m3(scaled)
            tl.store(q_ptr + at, scaled.to(tl.float8e4nv), mask=mask)
