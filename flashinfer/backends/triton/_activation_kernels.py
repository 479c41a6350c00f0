"""@triton.jit kernel for the gated activations (imported only when a kernel runs).

Grid ``(rows, cdiv(d, BLOCK))``: each program reads ``BLOCK`` gate values ``x[row, j]`` and
the matching ``x[row, d + j]``, computes in fp32 and stores ``out[row, j]``. The last dims
must have stride 1 (the launcher in ``activation.py`` guarantees it); offsets are int64.
"""

from __future__ import annotations

import triton
import triton.language as tl

SILU = tl.constexpr(0)
GELU = tl.constexpr(1)
GELU_TANH = tl.constexpr(2)


@triton.jit
def act_and_mul_kernel(x_ptr, out_ptr, d, x_stride, out_stride,
                       ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    x_row = x_ptr + row * x_stride
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + d + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == SILU:
        act = gate * tl.sigmoid(gate)
    elif ACT == GELU:
        act = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476))
    else:
        # 0.5 * (1 + tanh(z)) == sigmoid(2 z), z = sqrt(2/pi) * (g + 0.044715 g^3)
        z2 = 1.5957691216057308 * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(z2)
    y = act * up
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
