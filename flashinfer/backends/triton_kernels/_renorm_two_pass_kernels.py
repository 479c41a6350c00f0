"""@triton.jit kernel of the top-k renormalisation by candidates (variant ``two_pass`` of
renorm_probs), for a scalar ``1 <= k <= BLOCK / 4``.

The general threshold kernel (``_sampling_kernels.threshold_kernel``) searches the k-th largest
value with pivots, many operations per element and pass. This one borrows the two-pass sampler's
candidates (``_sampling_two_pass_kernels``):

1. **Pass 1**: per position of the block the four largest positive values, the row's sum and
   a bad flag (NaN, negative, +inf).
2. **Between the passes**: ``tau``, the k-th largest candidate, from the candidates above a
   group-maxima bound, compacted and sorted (``_top_k_bounds``).
3. **Pass 2**: the count and mass of ``{p >= tau}``. The count equal to the candidates' proves
   ``tau`` exact; otherwise it is found from full passes (``_exact_top_k_bounds``).
4. **Pass 3**: ``out = p / mass`` where ``p >= tau`` and ``p > 0``, else 0.

Three reads and a write of the row. The kept set is the contract's (``p > 0`` and fewer than
``k`` larger values, ties at the boundary all kept); a row that is not a distribution gives
zeros. The mass is summed in fp32 (the reference: float64).
"""

import triton
import triton.language as tl

from ._sampling_kernels import _unord
from ._sampling_two_pass_kernels import _exact_top_k_bounds, _row_ge, _top_k_bounds
from ._stream_kernels import first_pass


@triton.jit(do_not_specialize=["k_val"])
def top_k_renorm_kernel(src, dst, scratch, k_val, V, stride_src, stride_dst,
                        BLOCK: tl.constexpr, G: tl.constexpr, CAP: tl.constexpr):
    """Row ``program_id`` of ``src [R, V]`` (fp32/fp16/bf16) -> ``dst`` (its dtype). ``1 <= k_val
    < V``, ``k_val <= G <= BLOCK``, ``4 k_val <= BLOCK`` (the host checks); ``scratch`` fp32,
    ``CAP`` per row."""
    row = tl.program_id(0)
    row_ptr = src + row.to(tl.int64) * stride_src
    k = tl.zeros([], tl.int32) + k_val
    top0, top1, top2, top3, lane_sums, bad = first_pass(row_ptr, V, BLOCK, True)
    s_all = tl.sum(lane_sums, axis=0)
    ok = (bad == 0) & (s_all > 0.0) & (s_all < float("inf"))
    rmax = tl.max(top0, axis=0)
    tau_o, _b, n_tau = _top_k_bounds(top0, top1, top2, top3, s_all, rmax, k, 1.0, False,
                                     scratch, row, 0, BLOCK, G, CAP)
    n_full, mass = _row_ge(row_ptr, V, _unord(tau_o.to(tl.int32)), BLOCK)
    if ok & (n_full != n_tau):  # a lane held more than four of the top k: tau from full passes
        tau_o, _b = _exact_top_k_bounds(row_ptr, V, k, 1.0, False, s_all, rmax, 0, BLOCK)
        n_full, mass = _row_ge(row_ptr, V, _unord(tau_o.to(tl.int32)), BLOCK)
    tau = _unord(tau_o.to(tl.int32))
    scale = 1.0 / mass
    lane = tl.arange(0, BLOCK)
    out_ptr = dst + row.to(tl.int64) * stride_dst
    nxt = tl.load(row_ptr + lane, mask=lane < V, other=0.0)
    for start in range(0, V, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + start + BLOCK + lane, mask=start + BLOCK + lane < V, other=0.0)
        y = tl.where(ok & (x >= tau) & (x > 0.0), x * scale, 0.0)
        tl.store(out_ptr + start + lane, y.to(dst.dtype.element_ty), mask=start + lane < V)
