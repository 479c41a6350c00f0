"""Reference grouped / segment GEMM: one float64 matmul per segment, rounded once to ``out``.

Signatures are the canonical ones of :mod:`flashinfer.gemm_grouped`. Runs on any device; fp8
tensors are only converted (to float64), never multiplied as fp8. Rows of ``out`` that no
segment covers (before ``indptr[0]`` or from ``indptr[-1]`` on) are written as zeros, the value
upstream's zero-initialised output leaves there.

:func:`segment_bounds` and :func:`weight_choice` read the offsets and weight indices on the host
and check them; the torch loop kernels use them too.
"""

from __future__ import annotations

import torch

from . import KERNELS


def segment_bounds(indptr: torch.Tensor, rows: int, name: str) -> list[int]:
    """``indptr`` as a host list, checked: ``0 <= indptr[0] <= ... <= indptr[-1] <= rows``."""
    bounds = [int(v) for v in indptr.tolist()]
    if bounds and (bounds[0] < 0 or bounds[-1] > rows):
        raise ValueError(f"{name} must stay within [0, {rows}] (the rows of the input), "
                         f"got {name}[0] = {bounds[0]}, {name}[-1] = {bounds[-1]}")
    for i in range(len(bounds) - 1):
        if bounds[i + 1] < bounds[i]:
            raise ValueError(f"{name} must be non-decreasing, got {name}[{i}] = {bounds[i]} > "
                             f"{name}[{i + 1}] = {bounds[i + 1]}")
    return bounds


def weight_choice(weight_indices: torch.Tensor | None, num_segments: int,
                  num_weights: int) -> list[int]:
    """The weight each segment multiplies by: ``weight_indices`` (checked) or ``0..n-1``."""
    if weight_indices is None:
        return list(range(num_segments))
    chosen = [int(v) for v in weight_indices.tolist()]
    bad = [v for v in chosen if not 0 <= v < num_weights]
    if bad:
        raise ValueError(f"weight_indices must be in [0, {num_weights}) (num_weights), "
                         f"got {bad[0]}")
    return chosen


def zero_uncovered(out: torch.Tensor, bounds: list[int]) -> None:
    """Zero the rows of ``out`` outside ``[bounds[0], bounds[-1])``."""
    if not bounds:
        out.zero_()
        return
    out[:bounds[0]].zero_()
    out[bounds[-1]:].zero_()


@KERNELS.kernel("segment_gemm")
def segment_gemm(x: torch.Tensor, weights: torch.Tensor, seg_indptr: torch.Tensor,
                 weight_indices: torch.Tensor | None, weight_column_major: bool,
                 alpha: torch.Tensor | None, out: torch.Tensor) -> None:
    bounds = segment_bounds(seg_indptr, x.shape[0], "seg_indptr")
    chosen = weight_choice(weight_indices, len(bounds) - 1, weights.shape[0])
    acc = torch.zeros(out.shape, dtype=torch.float64, device=out.device)
    for seg, w_index in enumerate(chosen):
        start, end = bounds[seg], bounds[seg + 1]
        if start == end:
            continue
        w = weights[w_index].double()  # [k, n], or [n, k] when column-major
        acc[start:end] = x[start:end].double() @ (w.t() if weight_column_major else w)
    if alpha is not None:
        acc *= alpha.double().reshape(())
    out.copy_(acc)


@KERNELS.kernel("group_gemm_fp8_groupwise")
def group_gemm_fp8_groupwise(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                             b_scale: torch.Tensor, m_indptr: torch.Tensor,
                             granularity: tuple[int, int, int], out: torch.Tensor) -> None:
    gm, gn, gk = granularity
    k, n = a.shape[1], b.shape[1]
    bounds = segment_bounds(m_indptr, a.shape[0], "m_indptr")
    acc = torch.zeros(out.shape, dtype=torch.float64, device=out.device)
    for g in range(len(bounds) - 1):
        start, end = bounds[g], bounds[g + 1]
        if start == end:
            continue
        # scale row of a segment's row r: start // gm + (r - start) // gm (upstream's layout)
        scale_rows = start // gm + torch.arange(end - start, device=a.device) // gm
        sa = a_scale[scale_rows].double().repeat_interleave(gk, 1)[:, :k]
        sb = b_scale[g].double().repeat_interleave(gn, 0).repeat_interleave(gk, 1)[:n, :k]
        acc[start:end] = (a[start:end].double() * sa) @ (b[g].double() * sb).t()
    out.copy_(acc)
