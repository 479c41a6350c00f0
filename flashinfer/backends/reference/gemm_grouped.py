"""Reference grouped / segment GEMM: one float64 matmul per segment, rounded once to ``out``.

Signatures are the canonical ones of :mod:`flashinfer.gemm.grouped`. Runs on any device; fp8
tensors are only converted (to float64), never multiplied as fp8. Rows of ``out`` that no
segment covers (before ``indptr[0]`` or from ``indptr[-1]`` on) are written as zeros, the value
upstream's zero-initialised output leaves there.

:func:`segments` reads the offsets and weight indices on the host (a sync on a GPU: the slow
path) after reporting their bad entries into the device's error record under the caller's names
(``faults``, :class:`flashinfer.gemm.grouped.SegmentFaults`); the segments it returns follow the
documented result for bad entries (nothing past a bad offset, zero rows for a bad weight index).
The torch loop kernels use it too.
"""

from __future__ import annotations

import torch

from ...index_checks import report_device


def segments(indptr: torch.Tensor, weight_indices: torch.Tensor | None, rows: int,
             num_weights: int, faults) -> tuple[list[int], list[tuple[int, int, int | None]]]:
    """``(bounds, pieces)``: the offsets the kernels compute with, as a host list (non-decreasing
    within ``[0, rows]``), and ``(start, end, weight)`` of every non-empty segment, ``weight``
    None where its weight index is bad (its rows are zero). Bad entries are first merged into
    the device's error record (device ops; on the CPU the public call has raised for them)."""
    checks, offsets, weight_ok = faults.guard(indptr, rows, weight_indices, num_weights)
    for check in checks:
        report_device(check)
    bounds = offsets.tolist()
    count = len(bounds) - 1
    chosen = list(range(count)) if weight_indices is None else weight_indices.tolist()
    ok = [True] * count if weight_ok is None else weight_ok.tolist()
    pieces = [(bounds[i], bounds[i + 1], chosen[i] if ok[i] else None) for i in range(count)
              if bounds[i] < bounds[i + 1]]
    return bounds, pieces


def zero_uncovered(out: torch.Tensor, bounds: list[int]) -> None:
    """Zero the rows of ``out`` outside ``[bounds[0], bounds[-1])``."""
    if not bounds:
        out.zero_()
        return
    out[:bounds[0]].zero_()
    out[bounds[-1]:].zero_()


def segment_gemm(x: torch.Tensor, weights: torch.Tensor, seg_indptr: torch.Tensor,
                 weight_indices: torch.Tensor | None, weight_column_major: bool,
                 alpha: torch.Tensor | None, out: torch.Tensor, faults) -> None:
    _, pieces = segments(seg_indptr, weight_indices, x.shape[0], weights.shape[0], faults)
    acc = torch.zeros(out.shape, dtype=torch.float64, device=out.device)
    for start, end, w_index in pieces:
        if w_index is None:
            continue
        w = weights[w_index].double()  # [k, n], or [n, k] when column-major
        acc[start:end] = x[start:end].double() @ (w.t() if weight_column_major else w)
        if alpha is not None:  # the segments' rows only: uncovered rows stay 0 for any alpha
            acc[start:end] *= alpha.double().reshape(())
    out.copy_(acc)


def group_gemm_fp8_groupwise(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                             b_scale: torch.Tensor, m_indptr: torch.Tensor,
                             granularity: tuple[int, int, int], out: torch.Tensor,
                             faults) -> None:
    gm, gn, gk = granularity
    k, n = a.shape[1], b.shape[1]
    _, pieces = segments(m_indptr, None, a.shape[0], b.shape[0], faults)
    acc = torch.zeros(out.shape, dtype=torch.float64, device=out.device)
    for start, end, g in pieces:
        # scale row of a segment's row r: start // gm + (r - start) // gm (upstream's layout)
        scale_rows = start // gm + torch.arange(end - start, device=a.device) // gm
        sa = a_scale[scale_rows].double().repeat_interleave(gk, 1)[:, :k]
        sb = b_scale[g].double().repeat_interleave(gn, 0).repeat_interleave(gk, 1)[:n, :k]
        acc[start:end] = (a[start:end].double() * sa) @ (b[g].double() * sb).t()
    out.copy_(acc)
