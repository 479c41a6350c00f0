"""Reference GEMM kernels: dequantise to float32, one float32 matmul, round once to ``out``.

Signatures are the canonical ones of :mod:`flashinfer.gemm`. Runs on any device (fp8 tensors are
only converted, never multiplied, so CPUs without fp8 matmul run it too). A product of two fp8
values is exact in float32; the sums are float32.
"""

from __future__ import annotations

import torch



def mm_bf16(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
            out: torch.Tensor) -> None:
    acc = a.float() @ b.float()
    if bias is not None:
        acc += bias.float()
    out.copy_(acc)


def bmm_fp8(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
            out: torch.Tensor) -> None:
    scale = A_scale.float().reshape(()) * B_scale.float().reshape(())
    out.copy_(torch.matmul(A.float(), B.float()) * scale)  # 3-D, or 2-D for one product


def expand_scale(scale: torch.Tensor, rows: int, cols: int, block_rows: int,
                 block_cols: int) -> torch.Tensor:
    """``[ceil(rows/br), ceil(cols/bc)]`` block scales -> a float32 ``[rows, cols]`` map (the
    last block of a dimension may be partial)."""
    full = scale.float().repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return full[:rows, :cols]


def gemm_fp8_groupwise(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                       b_scale: torch.Tensor, granularity: tuple[int, int, int],
                       out: torch.Tensor) -> None:
    gm, gn, gk = granularity
    (m, k), n = a.shape, b.shape[0]
    a_deq = a.float() * expand_scale(a_scale, m, k, gm, gk)
    b_deq = b.float() * expand_scale(b_scale, n, k, gn, gk)
    out.copy_(a_deq @ b_deq.t())


def mm_fp4(a: torch.Tensor, b: torch.Tensor, a_sf: torch.Tensor, b_sf: torch.Tensor,
           alpha: torch.Tensor | None, block_size: int, a_sf_8x4: bool,
           out: torch.Tensor) -> None:
    """Dequantise both FP4 operands to float64 (exact), one float64 matmul, round once."""
    from ...fp4_format import gemm_operands

    a_deq, b_deq = gemm_operands(a, b, a_sf, b_sf, block_size, a_sf_8x4, torch.float64)
    acc = a_deq @ b_deq.t()
    if alpha is not None:
        acc *= alpha.double().reshape(())
    out.copy_(acc)
