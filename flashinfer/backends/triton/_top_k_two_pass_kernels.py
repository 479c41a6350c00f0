"""@triton.jit kernels of top-k renormalisation and top-k logit masking by candidates (variant
``two_pass`` of renorm_probs and of top_k_mask_logits), for a scalar ``1 <= k <= BLOCK / 4``.

The general threshold kernel (``_sampling_kernels.threshold_kernel``) searches the k-th largest
value with pivots, many operations per element and pass. These use the lanes' candidates
(``_stream_kernels``):

1. **Pass 1**: per position of the block the four largest values (probabilities: positive ones,
   with the row's sum and a bad flag for NaN, negative, +inf; logits: all but NaN).
2. **Between the passes**: ``tau``, the k-th largest candidate, and the candidates' mass at or
   above it, from the candidates above a group-maxima bound, compacted and sorted.
3. **Pass 2** writes the output (``p / mass`` where ``p >= tau``, else 0; or the logit where
   ``x >= tau``, else ``-inf``) and counts the tokens ``>= tau``. A count equal to the
   candidates' proves ``tau`` and the mass exact; otherwise both are found from full passes
   (bisection, 32 counting passes) and the row is written again.

Two reads and a write of the row in the common case. The kept set is the contract's (fewer than
``k`` larger values, ties at the boundary all kept; probabilities also ``p > 0``). A row of
probabilities that is not a distribution gives zeros; a NaN logit is masked; fewer than ``k``
finite logits keep every finite one. The mass is summed in fp32 (the reference: float64).
"""

import triton
import triton.language as tl

from ._sampling_kernels import _unord
from ._stream_kernels import FINITE_FLOOR, candidates_tau, count_at_least, exact_tau, first_pass


@triton.jit
def _write_kept(row_ptr, out_ptr, V, tau, scale, ok, BLOCK: tl.constexpr,
                RENORM: tl.constexpr):
    """Write the row: kept ``x >= tau`` as ``x * scale`` (RENORM; 0 elsewhere and everywhere
    unless ``ok``) or as ``x`` (``-inf`` elsewhere); returns how many were kept."""
    lane = tl.arange(0, BLOCK)
    cnt = tl.zeros([BLOCK], tl.int32)
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=float("-inf"))
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V,
                      other=float("-inf"))
        keep = x >= tau
        cnt += keep.to(tl.int32)
        if RENORM:
            y = tl.where(ok & keep, x * scale, 0.0)
        else:
            y = tl.where(keep, x, float("-inf"))
        tl.store(out_ptr + start + lane, y.to(out_ptr.dtype.element_ty), mask=start + lane < V)
    return tl.sum(cnt, axis=0)


@triton.jit(do_not_specialize=["k_val"])
def top_k_renorm_kernel(src, dst, scratch, k_val, V, stride_src, stride_dst,
                        BLOCK: tl.constexpr, G: tl.constexpr, CAP: tl.constexpr):
    """Row ``program_id`` of probabilities ``src [R, V]`` (fp32/fp16/bf16) -> ``dst`` (its
    dtype). ``1 <= k_val < V``, ``k_val <= G <= BLOCK``, ``4 k_val <= BLOCK`` (the host checks);
    ``scratch`` fp32, ``CAP`` per row."""
    row = tl.program_id(0)
    row_ptr = src + row.to(tl.int64) * stride_src
    out_ptr = dst + row.to(tl.int64) * stride_dst
    k = tl.zeros([], tl.int32) + k_val
    top0, top1, top2, top3, lane_sums, bad = first_pass(row_ptr, V, BLOCK, True, False)
    s_all = tl.sum(lane_sums, axis=0)
    ok = (bad == 0) & (s_all > 0.0) & (s_all < float("inf"))
    tau_o, n_tau, mass, _srt = candidates_tau(top0, top1, top2, top3, k, 1, scratch, row, BLOCK,
                                              G, CAP)
    n_kept = _write_kept(row_ptr, out_ptr, V, _unord(tau_o.to(tl.int32)), 1.0 / mass, ok, BLOCK,
                         True)
    if ok & (n_kept != n_tau):  # a lane held more than four of the top k: exact, then again
        tau_o = exact_tau(row_ptr, V, k, 1, BLOCK)
        tau = _unord(tau_o.to(tl.int32))
        _n, mass = count_at_least(row_ptr, V, tau, 0.0, BLOCK, False)
        _write_kept(row_ptr, out_ptr, V, tau, 1.0 / mass, ok, BLOCK, True)


@triton.jit(do_not_specialize=["k_val"])
def top_k_mask_kernel(src, dst, scratch, k_val, V, stride_src, stride_dst,
                      BLOCK: tl.constexpr, G: tl.constexpr, CAP: tl.constexpr):
    """Row ``program_id`` of logits ``src [R, V]`` (fp32/fp16/bf16) -> ``dst`` (its dtype), the
    same conditions as ``top_k_renorm_kernel``."""
    row = tl.program_id(0)
    row_ptr = src + row.to(tl.int64) * stride_src
    out_ptr = dst + row.to(tl.int64) * stride_dst
    k = tl.zeros([], tl.int32) + k_val
    top0, top1, top2, top3, _sums, _bad = first_pass(row_ptr, V, BLOCK, True, True)
    tau_o, n_tau, _mass, _srt = candidates_tau(top0, top1, top2, top3, k, FINITE_FLOOR, scratch,
                                               row, BLOCK, G, CAP)
    n_kept = _write_kept(row_ptr, out_ptr, V, _unord(tau_o.to(tl.int32)), 1.0, True, BLOCK,
                         False)
    if n_kept != n_tau:  # a lane held more than four of the top k: exact, then again
        tau_o = exact_tau(row_ptr, V, k, FINITE_FLOOR, BLOCK)
        _write_kept(row_ptr, out_ptr, V, _unord(tau_o.to(tl.int32)), 1.0, True, BLOCK, False)
