"""Triton fp8 GEMMs: launch configuration and the registered kernels.

Kernel signatures and semantics: :mod:`flashinfer.gemm`. The @triton.jit code lives in
``_gemm_kernels.py`` and is imported on first use (this module must import without Triton).

* ``gemm_fp8_groupwise`` — block-scaled fp8 GEMM, scales applied per 128-wide K step: the
  DeepSeek-V3 recipe (granularity ``(1, 128, 128)``), ``(128, 128, 128)`` and row-wise
  ``(1, 1, >=K)``. Any M, N, K: partial last blocks read their block's scale, as the reference.
* ``bmm_fp8`` — per-tensor scales, ``A [Bt, M, K]`` x ``B [Bt, K, N]``, any strides.

Both take fp8 operands of one dtype (e4m3 x e4m3 or e5m2 x e5m2; a mixed pair is rejected by
the checks below) and write bf16 / fp16. Launch shape, from M: ``BLOCK_M`` 16 (decode-size M,
mma.sync), 64 or 128 (wgmma on SM 9.0); ``BLOCK_N = BLOCK_K = 128`` (``bmm_fp8`` narrows
BLOCK_N to 64 for decode-size M); tiles grouped 8 tile rows
at a time for L2 reuse. The groupwise kernel stops at 64 rows: it holds two 128-wide fp32 tiles
(the step's product and the accumulator), and at 128 x 128 with 8 warps ptxas (sm_90a) spills.
Pipeline depth: 4 stages for small tiles, 3 for 128-row tiles where shared memory is large
(SM 9.x / 10.x), 2 elsewhere (SM 8.9 / 12.x have about 100 KB per block).
"""

from __future__ import annotations


import torch

from ...reasons import Reason
from .launch import cdiv, device_of, fast

#: K step (and the scale-block width along K this kernel walks).
BLOCK_K = 128
BLOCK_N = 128
#: tile rows visited together (programs sharing B tiles in L2).
GROUP_M = 8


def block_m_for(m: int, largest: int = 128) -> int:
    """Tile rows for an M-row GEMM: 16 for decode-size M, 64 up to 64 rows, else ``largest``."""
    return 16 if m <= 16 else 64 if m <= 64 else largest


def launch_config(m: int, device: torch.device, largest: int = 128) -> tuple[int, int, int]:
    """``(BLOCK_M, num_warps, num_stages)`` for M rows on ``device``, at most ``largest`` rows."""
    block_m = block_m_for(m, largest)
    warps = 8 if block_m == 128 else 4
    if block_m < 128:
        return block_m, warps, 4
    big_smem = device.type != "cuda" or torch.cuda.get_device_capability(device)[0] in (9, 10)
    return block_m, warps, 3 if big_smem else 2




def _same_fp8(problem) -> list[Reason]:
    dtypes = dict(problem.dtypes)
    a, b = dtypes.get("a"), dtypes.get("b")
    if a is not None and b is not None and a != b:
        return [Reason("dtype.b", str(b), f"{a} (the dtype of a)",
                       "the Triton fp8 GEMM takes one fp8 dtype for both operands")]
    return []


def gemm_fp8_groupwise(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                       b_scale: torch.Tensor, granularity: tuple[int, int, int],
                       out: torch.Tensor) -> None:
    from . import _gemm_kernels

    gm, gn, gk = granularity
    (m, k), n = a.shape, b.shape[0]
    if gk % BLOCK_K and gk < k:
        raise ValueError(f"granularity {granularity}: the Triton kernel needs the K block to be "
                         f"a multiple of {BLOCK_K} or at least K = {k}")
    block_m, warps, stages = launch_config(m, a.device, largest=64)
    grid = (cdiv(m, block_m) * cdiv(n, BLOCK_N),)
    with device_of(a):
        fast(_gemm_kernels.gemm_fp8_groupwise_kernel)[grid](
            a, b, a_scale, b_scale, out, m, n, k,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
            out.stride(0), gm, gn, gk,
            BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
            DOT_F32=not a.is_cuda, num_warps=warps, num_stages=stages,
        )


def groupwise_reasons(problem) -> list[Reason]:
    return _same_fp8(problem)


def bmm_fp8(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
            out: torch.Tensor) -> None:
    from . import _gemm_kernels

    if A.dim() == 2:  # one product (mm_fp8)
        A, B, out = A[None], B[None], out[None]
    batch, m, k = A.shape
    n = B.shape[2]
    block_m, block_n, block_k, warps, stages = bmm_fp8_launch(m, n, k, A.device)
    grid = (cdiv(m, block_m) * cdiv(n, block_n), batch)
    with device_of(A):
        fast(_gemm_kernels.bmm_fp8_kernel)[grid](
            A, B, A_scale, B_scale, out, m, n, k,
            A.stride(0), A.stride(1), A.stride(2), B.stride(0), B.stride(1), B.stride(2),
            out.stride(0), out.stride(1),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=GROUP_M,
            DOT_F32=not A.is_cuda, num_warps=warps, num_stages=stages,
        )


def bmm_fp8_launch(m: int, n: int, k: int, device: torch.device) -> tuple[int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` of the per-tensor-scaled batched
    kernel: :func:`launch_config`'s rows, warps and stages with 128-deep K steps (its scales are
    per tensor, so K steps need not follow scale blocks) and 128-wide column tiles, except for
    decode-size M: 64-wide tiles (twice the programs on a weight-bound product), and 3 stages
    where K is one step. On the H200 at MLA's batch-128 products, us at M = 1 / 16 (cuDNN's
    graph in brackets): W_UV (N 128, K 512) 4.91 / 5.05 (4.99 / 5.32; 128-wide tiles 5.44 /
    5.58), W_UK (N 512, K 128) 4.83 / 4.96 (5.12 / 5.36; 128-wide 5.02 / 5.17, 64-wide with 4
    stages 6.14 / 6.29): ``benchmarks/results/tune_bmm_fp8_h200_2026-11-30_2043utc.json``."""
    block_m, warps, stages = launch_config(m, device)
    if block_m > 16:
        return block_m, BLOCK_N, BLOCK_K, warps, stages
    return block_m, 64, BLOCK_K, warps, 3 if k <= BLOCK_K else stages


def bmm_fp8_reasons(problem) -> list[Reason]:
    return _same_fp8(problem)
