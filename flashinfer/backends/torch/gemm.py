"""torch backend for the GEMM family: cuBLAS / cuBLASLt through ``torch.mm`` and ``torch._scaled_mm``.

* ``mm_bf16`` — ``torch.mm`` / ``torch.addmm`` (cuBLAS on CUDA, any CPU BLAS). A float32 output
  uses the ``mm.dtype`` overload (bf16 inputs, fp32 result, no bf16 rounding) where torch has it
  on CUDA, else an fp32 matmul of the upcast inputs; an fp16 output is the bf16 result converted.
* ``bmm_fp8:scaled_mm`` — ``torch._scaled_mm`` with per-tensor fp32 scales, one call per batch
  entry (cuBLASLt; SM 8.9+). cuBLASLt needs K and N multiples of 16 (capability record) and
  rejects e5m2 x e5m2 (check below).
* ``gemm_fp8_groupwise:scaled_mm_rowwise`` — ``torch._scaled_mm`` with row-wise scales
  (``scale_a [M, 1]``, ``scale_b [1, N]`` fp32, bf16 output), the granularity ``(1, 1, K)``.

* ``gemm_fp8_groupwise:scaled_mm_blockwise`` — ``torch._scaled_mm`` with DeepSeek-V3 scales,
  activations 1x128 (``scale_a [M, K/128]``, outer-dim-major) and weights 128x128 (``scale_b
  [K/128, ceil(N/128)]``; N a multiple of 16, K of 128): cuBLASLt's block-wise recipe, CUDA 12.9+ and SM 9.0 only (torch's own tests
  mark other SMs as expected failures), bf16 output, no fast accumulation.

Other block shapes (128x128 activations) go to our Triton kernel, arbitrary granularities to the
reference.
``_scaled_mm`` wants ``mat1`` row-major and ``mat2`` column-major; operands in another layout are
copied once into that layout.

Registered into the ``torch`` adapter's table (``backends/torch/attention.py`` imports this module).
"""

from __future__ import annotations

import torch

from ...reasons import Reason

_E5M2 = "float8_e5m2"


def _row_major(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _col_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` [k, n] as a column-major matrix (itself when it is one: read from its strides, no
    transposed view made on the hot path)."""
    k, n = t.shape
    s0, s1 = t.stride()
    if (s0 == 1 or k <= 1) and (s1 == k or n <= 1):
        return t
    return t.t().contiguous().t()


def _has_mm_dtype() -> bool:
    return "dtype_out" in torch.ops.aten.mm.overloads()


def mm_bf16(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
            out: torch.Tensor) -> None:
    if out.dtype == torch.float32:
        if a.is_cuda and _has_mm_dtype():
            torch.mm(a, b, out_dtype=torch.float32, out=out)
        else:
            torch.mm(a.float(), b.float(), out=out)
        if bias is not None:
            out.add_(bias)
        return
    if out.dtype == a.dtype:
        if bias is None:
            torch.mm(a, b, out=out)
        else:
            torch.addmm(bias, a, b, out=out)
        return
    out.copy_(torch.mm(a, b) if bias is None else torch.addmm(bias, a, b))


def bmm_fp8(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
            out: torch.Tensor) -> None:
    # the scales are fp32 one-element tensors (the op's contract): _scaled_mm takes them as is
    if A.dim() == 2:  # one product (mm_fp8): no per-batch views
        torch._scaled_mm(_row_major(A), _col_major(B), A_scale, B_scale, out_dtype=out.dtype,
                         out=out)
        return
    scale_a, scale_b = A_scale, B_scale
    for i in range(A.shape[0]):
        torch._scaled_mm(_row_major(A[i]), _col_major(B[i]), scale_a, scale_b,
                         out_dtype=out.dtype, out=out[i])


def bmm_fp8_reasons(problem) -> list[Reason]:
    dtypes = dict(problem.dtypes)
    if dtypes.get("a") == _E5M2 and dtypes.get("b") == _E5M2:
        return [Reason("dtype.b", _E5M2, "float8_e4m3fn when a is float8_e5m2",
                       "cuBLASLt has no e5m2 x e5m2 fp8 GEMM")]
    return []


def gemm_fp8_rowwise(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                     b_scale: torch.Tensor, granularity: tuple[int, int, int],
                     out: torch.Tensor) -> None:
    scale_a = a_scale.float().reshape(-1, 1).contiguous()
    scale_b = b_scale.float().reshape(1, -1).contiguous()
    torch._scaled_mm(_row_major(a), _col_major(b.t()), scale_a, scale_b,
                     out_dtype=out.dtype, out=out)


def rowwise_reasons(problem) -> list[Reason]:
    # a call always names its scale recipe; a Problem without one (explain's default) is not row-wise
    if "scale_rowwise" not in problem.features:
        return [Reason("feature", "none", "scale_rowwise",
                       "serves row-wise scales (granularity (1, 1, K)) only")]
    return []


def gemm_fp8_blockwise(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                       b_scale: torch.Tensor, granularity: tuple[int, int, int],
                       out: torch.Tensor) -> None:
    # cuBLASLt refuses the block-wise recipe for some M (M = 7 on the H200, cuBLASLt 13): rows
    # are padded to a multiple of 16 (zeros, scale 1) and the extra output rows dropped
    m = a.shape[0]
    rows = -(-m // 16) * 16
    if rows != m:
        a = torch.cat([a, a.new_zeros(rows - m, a.shape[1])])
        a_scale = torch.cat([a_scale, a_scale.new_ones(rows - m, a_scale.shape[1])])
    scale_a = a_scale.float().t().contiguous().t()  # [M, K/128], outer-dim-major
    scale_b = b_scale.float().contiguous().t()      # [K/128, ceil(N/128)]
    if rows == m:
        torch._scaled_mm(_row_major(a), _col_major(b.t()), scale_a, scale_b,
                         out_dtype=out.dtype, out=out)
    else:
        out.copy_(torch._scaled_mm(_row_major(a), _col_major(b.t()), scale_a, scale_b,
                                   out_dtype=out.dtype)[:m])


def mm_fp4_dequant(a: torch.Tensor, b: torch.Tensor, a_sf: torch.Tensor, b_sf: torch.Tensor,
                   alpha: torch.Tensor | None, block_size: int, a_sf_8x4: bool,
                   out: torch.Tensor) -> None:
    """No native FP4: dequantise both operands to bf16 (exact for e4m3 scales), one torch.mm
    with an fp32 result (cuBLAS; fp32 matmul of the bf16 values on the CPU), times alpha."""
    from ...fp4_format import gemm_operands

    a_deq, b_deq = gemm_operands(a, b, a_sf, b_sf, block_size, a_sf_8x4, torch.bfloat16)
    if not a.is_cuda:
        acc = a_deq.float() @ b_deq.float().t()
    elif _has_mm_dtype():
        acc = torch.mm(a_deq, b_deq.t(), out_dtype=torch.float32)
    else:
        acc = torch.mm(a_deq, b_deq.t()).float()
    if alpha is not None:
        acc.mul_(alpha.reshape(()))
    out.copy_(acc)
