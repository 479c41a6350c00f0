"""torch backend for grouped / segment GEMM: ``torch._grouped_mm`` (CUTLASS inside torch) and loops
of ``torch.mm`` (cuBLAS / CPU BLAS).

* ``segment_gemm:grouped_mm`` — one ``torch._grouped_mm(x, W, offs=indptr[1:])`` call, bf16 only
  (torch's grouped GEMM takes bf16 inputs), bf16 output. ``W`` is ``weights`` (or
  ``weights[weight_indices]``, gathered) as ``[segments, k, n]``; column-major weights go in as a
  transposed view (torch accepts either layout). torch needs every operand's leading stride to
  be a multiple of 16 bytes (k and n multiples of 8, capability record) and 16-byte aligned data;
  an operand that is not is copied once. The offsets are not read on the host (no sync, CUDA
  graph safe): the rules run as device ops (``faults.guard``), bad entries go to the device's
  error record, torch gets the guarded offsets (nothing computed past a bad one) and gathers
  weight 0 for a bad weight index, zeroed (its rows come out zero); rows outside
  ``[indptr[0], indptr[-1])`` are zeroed on the device. Called with ``out=None`` (the caller
  gave no output) it returns torch's result itself, zeroed in place by
  :func:`~.row_cleanup.zero_rows_outside` (a launch that touches only uncovered rows); a given
  ``out`` costs one masked pass, as torch's grouped GEMM has no ``out=``.
* ``segment_gemm:segment_loop`` — one ``torch.mm`` per non-empty segment into ``out``'s rows (any
  device, fp16/bf16/fp8 inputs; fp8 and mixed output dtypes go through float32). Reads the
  offsets on the host (one sync), after reporting bad entries (``reference.segments``).
* ``group_gemm_fp8_groupwise:dequant_loop`` — per group: dequantise ``a``'s rows and ``b[g]``
  block by block to float32, one float32 ``torch.mm``, round once to ``out``. Any device; the
  fp8 path torch lacks (its grouped fp8 GEMM takes row-wise scales only).

Registered into the ``torch`` adapter's table (``backends/torch/attention.py`` imports this module).
"""

from __future__ import annotations

import torch

from ...index_checks import report_device
from ..reference.gemm_grouped import segments, zero_uncovered
from ..shared.row_cleanup import zero_rows_outside


def _grouped_mm_operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when torch's grouped GEMM accepts its strides and alignment, else a copy."""
    stride, align = t.stride(), 16 // t.element_size()
    ok_layout = ((stride[-1] == 1 and stride[-2] % align == 0)
                 or (stride[-2] == 1 and stride[-1] % align == 0))
    if ok_layout and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def segment_gemm_grouped(x: torch.Tensor, weights: torch.Tensor, seg_indptr: torch.Tensor,
                         weight_indices: torch.Tensor | None, weight_column_major: bool,
                         alpha: torch.Tensor | None, out: torch.Tensor | None, faults):
    """Writes ``out``; with ``out=None`` returns torch's own result instead (no copy: torch's
    grouped GEMM has no ``out=``, so writing into a given ``out`` costs one more pass)."""
    checks, seg_indptr, weight_ok = faults.guard(seg_indptr, x.shape[0], weight_indices,
                                                 weights.shape[0])
    for check in checks:
        report_device(check)
    if weight_indices is None:
        w = weights
    else:  # a bad index gathers weight 0, zeroed: its segment's rows come out zero
        w = weights.index_select(0, torch.where(weight_ok, weight_indices, 0))
        w.masked_fill_(~weight_ok[:, None, None], 0)
    mat_b = w.transpose(1, 2) if weight_column_major else w
    offs = seg_indptr[1:].to(torch.int32)
    y = torch._grouped_mm(_grouped_mm_operand(x), _grouped_mm_operand(mat_b), offs=offs)
    if alpha is not None:
        y.mul_(alpha.reshape(()))
    if out is None:
        zero_rows_outside(y, seg_indptr)
        return y
    rows = torch.arange(x.shape[0], device=x.device)
    inside = (rows >= seg_indptr[0]) & (rows < seg_indptr[-1])
    torch.where(inside.unsqueeze(1), y, y.new_zeros(()), out=out)
    return None


segment_gemm_grouped.returns_output = True


def segment_gemm_loop(x: torch.Tensor, weights: torch.Tensor, seg_indptr: torch.Tensor,
                      weight_indices: torch.Tensor | None, weight_column_major: bool,
                      alpha: torch.Tensor | None, out: torch.Tensor, faults) -> None:
    bounds, pieces = segments(seg_indptr, weight_indices, x.shape[0], weights.shape[0], faults)
    zero_uncovered(out, bounds)
    direct = x.dtype == out.dtype and alpha is None  # mm straight into out's rows
    for start, end, w_index in pieces:
        if w_index is None:  # a bad weight index: zero rows
            out[start:end].zero_()
            continue
        w = weights[w_index]
        w = w.t() if weight_column_major else w
        if direct:
            torch.mm(x[start:end], w, out=out[start:end])
            continue
        y = torch.mm(x[start:end].float(), w.float())
        if alpha is not None:
            y *= alpha.float().reshape(())
        out[start:end].copy_(y)


def group_gemm_fp8_dequant_loop(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                                b_scale: torch.Tensor, m_indptr: torch.Tensor,
                                granularity: tuple[int, int, int], out: torch.Tensor,
                                faults) -> None:
    gm, gn, gk = granularity
    k, n = a.shape[1], b.shape[1]
    bounds, pieces = segments(m_indptr, None, a.shape[0], b.shape[0], faults)
    zero_uncovered(out, bounds)
    for start, end, g in pieces:
        scale_rows = start // gm + torch.arange(end - start, device=a.device) // gm
        sa = a_scale[scale_rows].float().repeat_interleave(gk, 1)[:, :k]
        sb = b_scale[g].float().repeat_interleave(gn, 0).repeat_interleave(gk, 1)[:n, :k]
        out[start:end].copy_(torch.mm(a[start:end].float() * sa, (b[g].float() * sb).t()))
