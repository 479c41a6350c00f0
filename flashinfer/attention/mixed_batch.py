"""``flashinfer.attention.BatchAttention``: upstream's holistic wrapper for a batch mixing
prefill and decode requests over one paged cache, planned with each request's kv length.

Routed like POD (:mod:`.pod`): the requests of one query token go to the batch decode wrapper
(tensor-core form), the others to the batch prefill wrapper, the two on two streams, their rows
gathered from ``q`` and scattered back into ``out`` / ``lse`` in request order; a batch of one
kind runs on that kind's wrapper alone, and one whose head dims differ on the prefill wrapper
alone (``wrapper.mode``, ``wrapper.decisions``). One prefill launch over both kinds was measured
2.4x slower than the two wrappers on the H200 (POD's note). ``kv_len_arr`` gives the last page's
fill (``kv_len - (pages - 1) * page_size``), checked against the pages.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .. import envs
from ..api_logging import flashinfer_api
from .batch_checks import host_index_arrays
from .batch_decode import BatchDecodeWithPagedKVCacheWrapper
from .batch_prefill import BatchPrefillWithPagedKVCacheWrapper
from .pod import concurrently

#: upstream's BatchAttention owns a 384 MB float workspace; the kernels here take what they need
WORKSPACE_BYTES = 128 << 20


class BatchAttention:
    """Mixed prefill / decode attention over a paged cache; ``run`` returns ``(out, lse)``."""

    def __init__(self, kv_layout: str = "NHD", device="cuda") -> None:
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout)
        self._decode = BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout,
                                                          use_tensor_cores=True)
        self.device = self._prefill.device
        self._planned = False
        self.mode: str | None = None
        self.decisions: dict = {}

    @flashinfer_api
    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
             kv_len_arr: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             head_dim_vo: int, page_size: int, causal: bool = False,
             sm_scale: Optional[float] = None, logits_soft_cap: Optional[float] = None,
             q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
             use_profiler: bool = False) -> None:
        """``qo_indptr [B+1]``, ``kv_indptr [B+1]`` (pages), ``kv_indices``, ``kv_len_arr [B]``
        (tokens), int32 on the host or the device."""
        if use_profiler:
            raise NotImplementedError("use_profiler=True (upstream's profiler build) is not "
                                      "supported")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        qo, kv, lens = host_index_arrays(("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr),
                                         ("kv_len_arr", kv_len_arr))
        if lens.shape[0] != kv.shape[0] - 1:
            raise ValueError(f"kv_len_arr must have len(kv_indptr) - 1 = {kv.shape[0] - 1} "
                             f"entries, got {lens.shape[0]}")
        pages = (kv[1:] - kv[:-1]).numpy().astype(np.int64)
        n = lens.numpy().astype(np.int64)
        bad = np.flatnonzero((n < 0) | (n > pages * page_size) | (n <= (pages - 1) * page_size))
        if bad.size:
            b = int(bad[0])
            raise ValueError(f"kv_len_arr[{b}] = {int(n[b])} does not fit request {b}'s "
                             f"{int(pages[b])} pages of {page_size} (needs "
                             f"({int(pages[b]) - 1} * {page_size}, {int(pages[b]) * page_size}])")
        last = np.where(pages > 0, n - (pages - 1) * page_size, 0).astype(np.int32)
        qo_lens = (qo[1:] - qo[:-1]).numpy()
        one = qo_lens == 1
        kinds = {"decode": np.flatnonzero(one), "prefill": np.flatnonzero(~one)}
        if head_dim_qk != head_dim_vo or not kinds["decode"].size:
            kinds = {"prefill": np.arange(len(qo_lens))}
        elif not kinds["prefill"].size:
            kinds = {"decode": kinds["decode"]}
        kv_np, qo_np = kv.numpy().astype(np.int64), qo.numpy().astype(np.int64)
        self._parts = {}
        for kind, reqs in kinds.items():
            whole = len(kinds) == 1
            k_ptr = np.concatenate([[0], np.cumsum(pages[reqs])]).astype(np.int32)
            ids = kv_indices if whole else kv_indices[torch.from_numpy(
                _ranges(kv_np[reqs], kv_np[reqs + 1])).to(kv_indices.device)]
            lasts = torch.from_numpy(last[reqs])
            if kind == "decode":
                self._decode.plan(torch.from_numpy(k_ptr), ids, lasts, num_qo_heads,
                                  num_kv_heads, head_dim_qk, page_size,
                                  logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                                  kv_data_type=kv_data_type, sm_scale=sm_scale)
            else:
                q_ptr = torch.from_numpy(np.concatenate([[0], np.cumsum(qo_lens[reqs])])
                                         .astype(np.int32))
                self._prefill.plan(q_ptr, torch.from_numpy(k_ptr), ids, lasts, num_qo_heads,
                                   num_kv_heads, head_dim_qk, page_size, head_dim_vo=head_dim_vo,
                                   causal=causal, sm_scale=sm_scale,
                                   logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                                   kv_data_type=kv_data_type)
            rows = None if whole else torch.from_numpy(
                _ranges(qo_np[reqs], qo_np[reqs + 1])).to(self.device)
            self._parts[kind] = rows
        self.mode = "two_streams" if len(kinds) == 2 else next(iter(kinds))
        self.decisions = {k: (self._decode if k == "decode" else self._prefill).decision
                          for k in kinds}
        self._cap = logits_soft_cap or 0.0
        self._reserve = envs.POD_RESERVED_SMS.get()
        self._shape = (int(qo[-1]), num_qo_heads, head_dim_vo)
        self._planned = True

    @flashinfer_api
    def run(self, q: torch.Tensor, kv_cache, out: Optional[torch.Tensor] = None,
            lse: Optional[torch.Tensor] = None, k_scale=None, v_scale=None,
            logits_soft_cap: float = 0.0, profiler_buffer=None, kv_cache_sf=None):
        """``(out [qo_indptr[-1], H_qo, head_dim_vo], lse [qo_indptr[-1], H_qo])`` (lse float32,
        base 2). ``logits_soft_cap`` is the plan's (a different non-zero value is refused)."""
        if not self._planned:
            raise RuntimeError("BatchAttention.run() called before plan()")
        if profiler_buffer is not None or kv_cache_sf is not None:
            raise NotImplementedError("profiler_buffer and kv_cache_sf (NVFP4) are not supported")
        if logits_soft_cap and logits_soft_cap != self._cap:
            raise ValueError(f"logits_soft_cap={logits_soft_cap} differs from the planned "
                             f"{self._cap}: pass it to plan()")
        scales = dict(k_scale=k_scale, v_scale=v_scale)
        wrappers = {"decode": self._decode, "prefill": self._prefill}
        if len(self._parts) == 1:
            return wrappers[self.mode].run(q, kv_cache, out=out, lse=lse, return_lse=True,
                                           **scales)
        rows_p, rows_d = self._parts["prefill"], self._parts["decode"]
        (o_p, s_p), (o_d, s_d) = concurrently(
            lambda: self._prefill.run(q.index_select(0, rows_p), kv_cache, return_lse=True,
                                      **scales),
            lambda: self._decode.run(q.index_select(0, rows_d), kv_cache, return_lse=True,
                                     **scales), self._reserve)
        total, heads, dim = self._shape
        if out is None:
            out = torch.empty(total, heads, dim, dtype=o_p.dtype, device=o_p.device)
        if lse is None:
            lse = torch.empty(total, heads, dtype=torch.float32, device=o_p.device)
        out.index_copy_(0, rows_p, o_p.to(out.dtype)).index_copy_(0, rows_d, o_d.to(out.dtype))
        lse.index_copy_(0, rows_p, s_p).index_copy_(0, rows_d, s_d)
        return out, lse


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """int64 ``concat(arange(s, e) for s, e in zip(starts, ends))``."""
    sizes = ends - starts
    return np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + np.arange(
        int(sizes.sum()))


__all__ = ["BatchAttention"]
