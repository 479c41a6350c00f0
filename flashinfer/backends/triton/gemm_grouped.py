"""Triton grouped / segment GEMM: launch configuration and the registered kernels.

Kernel signatures and semantics: :mod:`flashinfer.gemm.grouped`. The @triton.jit code lives in
``_gemm_grouped_kernels.py`` (imported on first use; this module must import without Triton),
whose docstring states how tiles map to segments: one launch over tiles that never straddle two
segments, found on the device from the offsets (no host sync, CUDA-graph safe); rows outside
``[indptr[0], indptr[-1])`` are written as zeros by the same launch. The same launch checks the
offsets and weight indices and reports the first bad entry of each into the device's error
record under the caller's names (``faults``: the codes of its
:class:`~flashinfer.gemm.grouped.SegmentFaults`), with the documented result (nothing computed
past a bad offset, zero rows for a bad weight index).

* ``segment_gemm`` — fp16 / bf16 ``x`` and weights (``[W, K, N]`` or column-major
  ``[W, N, K]``), optional ``weight_indices`` and ``alpha``; fp16 / bf16 / fp32 output.
* ``group_gemm_fp8_groupwise`` — fp8 ``a`` / ``b`` (one dtype) with the block scales of the
  Triton fp8 GEMM (:mod:`.gemm`): ``(1, 128, 128)``, ``(128, 128, 128)``, row-wise ``(1, 1, >=K)``,
  applied per 128-wide K step; bf16 / fp16 output.

Launch shape: ``BLOCK_M`` from the mean segment length ``cdiv(M, S)`` (the offsets are not read
on the host), as :func:`.gemm.block_m_for`: 16, 64 or 128 rows (64 at most for fp8, see
:mod:`.gemm`); ``BLOCK_N`` 128; ``BLOCK_K`` 64 for 16-bit inputs, 128 for fp8 (the scale block).
Grid ``(cdiv(M, BLOCK_M) + S + 2, cdiv(N, BLOCK_N))``: every segment may leave one partial tile.
"""

from __future__ import annotations

import torch

from ...index_checks import record
from ...reasons import Reason
from .gemm import BLOCK_K as FP8_BLOCK_K, BLOCK_N, _same_fp8, launch_config
from .launch import cdiv, device_of, fast

#: K step of the 16-bit segment GEMM
BLOCK_K_16 = 64
#: most pieces (segments + the two uncovered ends) one launch takes: every program scans them all
#: at once to find its tile (a scan in several steps mis-assigned tiles on the H200)
MAX_PIECES = 4096


def _chunk(pieces: int, faults) -> int:
    """Power of two >= ``pieces`` (at least 16); ValueError past :data:`MAX_PIECES` naming the
    caller's offsets argument."""
    if pieces > MAX_PIECES:
        name = f"{faults.offsets.function}: {faults.offsets.argument}"
        raise ValueError(f"{name}: {pieces - 2} segments; backend='triton' takes at most "
                         f"{MAX_PIECES - 2} (use backend='torch')")
    return max(16, 1 << (pieces - 1).bit_length())


def _grid(m: int, n: int, segments: int, block_m: int) -> tuple[int, int]:
    return cdiv(m, block_m) + segments + 2, cdiv(n, BLOCK_N)


def segment_gemm(x: torch.Tensor, weights: torch.Tensor, seg_indptr: torch.Tensor,
                 weight_indices: torch.Tensor | None, weight_column_major: bool,
                 alpha: torch.Tensor | None, out: torch.Tensor, faults) -> None:
    from . import _gemm_grouped_kernels

    (m, k), n, segments = x.shape, out.shape[1], seg_indptr.shape[0] - 1
    s_ww, s_a, s_b = weights.stride()
    s_wk, s_wn = (s_b, s_a) if weight_column_major else (s_a, s_b)
    block_m, warps, stages = launch_config(cdiv(m, max(segments, 1)), x.device)
    with device_of(x):
        fast(_gemm_grouped_kernels.segment_gemm_kernel)[_grid(m, n, segments, block_m)](
            x, weights, seg_indptr,
            seg_indptr if weight_indices is None else weight_indices,
            seg_indptr if alpha is None else alpha, out, record(x.device),
            m, n, k, segments, weights.shape[0], faults.offsets.code,
            faults.weight_indices.code if weight_indices is not None else 0,
            x.stride(0), x.stride(1), s_ww, s_wk, s_wn, out.stride(0),
            HAS_WIDX=weight_indices is not None, HAS_ALPHA=alpha is not None, LENS=faults.lens,
            BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K_16,
            CHUNK=_chunk(segments + 2, faults),
            DOT_F32=not x.is_cuda, num_warps=warps, num_stages=stages,
        )


def group_gemm_fp8_groupwise(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                             b_scale: torch.Tensor, m_indptr: torch.Tensor,
                             granularity: tuple[int, int, int], out: torch.Tensor,
                             faults) -> None:
    from . import _gemm_grouped_kernels

    gm, gn, gk = granularity
    (m, k), (groups, n) = a.shape, b.shape[:2]
    if gk % FP8_BLOCK_K and gk < k:
        raise ValueError(f"granularity {granularity}: the Triton kernel needs the K block to be "
                         f"a multiple of {FP8_BLOCK_K} or at least K = {k}")
    block_m, warps, stages = launch_config(cdiv(m, max(groups, 1)), a.device, largest=64)
    with device_of(a):
        fast(_gemm_grouped_kernels.group_gemm_fp8_kernel)[_grid(m, n, groups, block_m)](
            a, b, a_scale, b_scale, m_indptr, out, record(a.device), m, n, k, groups,
            faults.offsets.code,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2),
            a_scale.stride(0), a_scale.stride(1),
            b_scale.stride(0), b_scale.stride(1), b_scale.stride(2), out.stride(0),
            gm, gn, gk,
            BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=FP8_BLOCK_K,
            CHUNK=_chunk(groups + 2, faults),
            DOT_F32=not a.is_cuda, num_warps=warps, num_stages=stages,
        )


def group_fp8_reasons(problem) -> list[Reason]:
    return _same_fp8(problem)
