"""Upstream's legacy two-level cascade wrappers: a prefix shared by every request, held as
contiguous ``k_shared`` / ``v_shared``, then each request's own tokens in a paged cache.

The shared part is one single-request prefill of all the queries over the prefix (non-causal:
the prefix precedes every query; it is read once for the whole batch), the unique part the batch
decode / paged prefill wrapper, and the two states are merged (:mod:`.merge`). Each part runs
on the kernel its own Decision picks. The unique part is planned at the first ``forward`` and
again when the query dtype, the scales or (prefill) ``causal`` change: those arrive with
``forward`` (``data_type`` of the decode form's ``begin_forward`` is kept for its signature;
q's dtype decides).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..api_logging import flashinfer_api
from .batch_decode import BatchDecodeWithPagedKVCacheWrapper
from .batch_prefill import BatchPrefillWithPagedKVCacheWrapper
from .merge import merge_state
from .single import single_prefill_with_kv_cache


class _SharedPrefix:
    """The shared-prefix state merged into the unique part's."""

    def __init__(self, kv_layout: str, unique) -> None:
        self._kv_layout = kv_layout
        self._unique = unique
        self._args: tuple | None = None
        self._planned_for = None

    def _merged(self, q, k_shared, v_shared, unique_out, unique_lse, sm_scale, rope_scale,
                rope_theta, use_fp16_qk_reduction) -> torch.Tensor:
        shared_out, shared_lse = single_prefill_with_kv_cache(
            q, k_shared, v_shared, causal=False, kv_layout=self._kv_layout,
            use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
            rope_scale=rope_scale, rope_theta=rope_theta, return_lse=True)
        return merge_state(shared_out, shared_lse, unique_out, unique_lse)[0]

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None) -> None:
        self._unique.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def end_forward(self) -> None:
        """Upstream no-op."""


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper(_SharedPrefix):
    """Decode (one query token per request, ``q [batch, H_qo, D]``) over a shared prefix and
    each request's paged tokens."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        super().__init__(kv_layout, BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer,
                                                                       kv_layout))

    @flashinfer_api
    def begin_forward(self, unique_kv_indptr: torch.Tensor, unique_kv_indices: torch.Tensor,
                      unique_kv_last_page_len: torch.Tensor, num_qo_heads: int,
                      num_kv_heads: int, head_dim: int, page_size: int,
                      data_type="float16") -> None:
        self._args = (unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len,
                      num_qo_heads, num_kv_heads, head_dim, page_size)
        self._planned_for = None

    plan = begin_forward

    @flashinfer_api
    def forward(self, q: torch.Tensor, k_shared: torch.Tensor, v_shared: torch.Tensor,
                unique_kv_cache, allow_fp16_qk_reduction: bool = False,
                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None) -> torch.Tensor:
        """``out [batch, H_qo, D]``; ``k_shared`` / ``v_shared`` ``[prefix, H_kv, D]`` (NHD) or
        ``[H_kv, prefix, D]`` (HND), ``unique_kv_cache`` as the batch decode wrapper takes it."""
        if self._args is None:
            raise RuntimeError("forward() called before begin_forward()")
        wanted = (q.dtype, sm_scale, rope_scale, rope_theta)
        if self._planned_for != wanted:
            self._unique.plan(*self._args, q_data_type=q.dtype, sm_scale=sm_scale,
                              rope_scale=rope_scale, rope_theta=rope_theta)
            self._planned_for = wanted
        out, lse = self._unique.run(q, unique_kv_cache, return_lse=True)
        return self._merged(q, k_shared, v_shared, out, lse, sm_scale, rope_scale, rope_theta,
                            allow_fp16_qk_reduction)

    run = forward


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper(_SharedPrefix):
    """Prefill (ragged ``q [total, H_qo, D]``) over a shared prefix and each request's paged
    tokens; ``causal`` masks the request's own tokens (bottom-right aligned)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        super().__init__(kv_layout, BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer,
                                                                        kv_layout))

    @flashinfer_api
    def begin_forward(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor,
                      paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor,
                      num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int) -> None:
        self._args = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                      num_qo_heads, num_kv_heads, head_dim, page_size)
        self._planned_for = None

    plan = begin_forward

    @flashinfer_api
    def forward(self, q: torch.Tensor, k_shared: torch.Tensor, v_shared: torch.Tensor,
                unique_kv_cache, causal: bool = False, allow_fp16_qk_reduction: bool = False,
                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None) -> torch.Tensor:
        """``out [total, H_qo, D]``; the shared K/V and the unique cache as for the decode form."""
        if self._args is None:
            raise RuntimeError("forward() called before begin_forward()")
        wanted = (q.dtype, bool(causal), sm_scale, rope_scale, rope_theta)
        if self._planned_for != wanted:
            self._unique.plan(*self._args, causal=bool(causal), q_data_type=q.dtype,
                              sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                              use_fp16_qk_reduction=allow_fp16_qk_reduction)
            self._planned_for = wanted
        out, lse = self._unique.run(q, unique_kv_cache, return_lse=True)
        return self._merged(q, k_shared, v_shared, out, lse, sm_scale, rope_scale, rope_theta,
                            allow_fp16_qk_reduction)

    run = forward


__all__ = ["BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
           "BatchPrefillWithSharedPrefixPagedKVCacheWrapper"]
