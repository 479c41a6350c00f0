"""@triton.jit code for row clean-up after a library GEMM (imported on first use).

``zero_rows_outside_kernel``: rows of ``y [M, N]`` outside ``[indptr[0], indptr[S])`` are set to
zero. One program per ``BLOCK_M`` rows reads the two offsets on the device; a block wholly
inside writes nothing, so a batch whose segments cover every row costs one small launch instead
of a pass over ``y``.
"""

import triton
import triton.language as tl


@triton.jit
def zero_rows_outside_kernel(y_ptr, indptr_ptr, S, M, N, stride_m,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start = tl.load(indptr_ptr).to(tl.int64)
    end = tl.load(indptr_ptr + S).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    outside = ((rows < start) | (rows >= end)) & (rows < M)
    if tl.sum(outside.to(tl.int32), axis=0) > 0:
        zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=y_ptr.dtype.element_ty)
        for n0 in range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            tl.store(y_ptr + rows[:, None] * stride_m + cols[None, :], zeros,
                     mask=outside[:, None] & (cols[None, :] < N))
