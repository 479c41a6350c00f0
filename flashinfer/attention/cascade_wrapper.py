"""``MultiLevelCascadeAttentionWrapper``: attention over a hierarchy of paged KV levels (a prefix
shared by many requests, then each request's own tokens), one batch prefill plan per level, the
levels' states merged (:mod:`flashinfer.attention.merge`).

Level ``i`` groups the same ragged queries by its ``qo_indptr_arr[i]`` (level 0 typically one
group of every query against the shared prefix, the last level one group per request) and reads
the pages ``paged_kv_indices_arr[i]``; every level must cover all the queries. Each level is
planned through :class:`~flashinfer.attention.batch_prefill.BatchPrefillWithPagedKVCacheWrapper`,
so it runs on whichever kernel that Decision picks (``wrapper.level_decisions``), and reads its
prefix once for all the queries grouped with it. ``causal`` masks the last level only (the
others lie wholly before every query of theirs). ``run`` takes the last level's output and lse,
then merges each other level in (``merge_state_in_place``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..api_logging import flashinfer_api
from .batch_prefill import BatchPrefillWithPagedKVCacheWrapper
from .merge import merge_state_in_place


class MultiLevelCascadeAttentionWrapper:
    """``num_levels`` paged prefill plans over one ragged query batch, merged.

    ``float_workspace_buffer``: shared by the levels (they run one after another on a stream).
    ``use_cuda_graph``: the four buffer lists hold each level's fixed buffers (as the batch
    prefill wrapper takes them)."""

    def __init__(self, num_levels: int, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False,
                 qo_indptr_buf_arr: Optional[Sequence[torch.Tensor]] = None,
                 paged_kv_indptr_buf_arr: Optional[Sequence[torch.Tensor]] = None,
                 paged_kv_indices_buf_arr: Optional[Sequence[torch.Tensor]] = None,
                 paged_kv_last_page_len_buf_arr: Optional[Sequence[torch.Tensor]] = None,
                 backend: str = "auto") -> None:
        if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 1:
            raise ValueError(f"num_levels must be an int >= 1, got {num_levels!r}")
        buffers = (qo_indptr_buf_arr, paged_kv_indptr_buf_arr, paged_kv_indices_buf_arr,
                   paged_kv_last_page_len_buf_arr)
        if use_cuda_graph:
            for name, arr in zip(("qo_indptr_buf_arr", "paged_kv_indptr_buf_arr",
                                  "paged_kv_indices_buf_arr", "paged_kv_last_page_len_buf_arr"),
                                 buffers):
                if arr is None or len(arr) != num_levels:
                    raise ValueError(f"use_cuda_graph=True needs {name}: one fixed buffer per "
                                     f"level ({num_levels}), got "
                                     f"{None if arr is None else len(arr)}")
        self._levels = [
            BatchPrefillWithPagedKVCacheWrapper(
                float_workspace_buffer, kv_layout, use_cuda_graph,
                **({"qo_indptr_buf": buffers[0][i], "paged_kv_indptr_buf": buffers[1][i],
                    "paged_kv_indices_buf": buffers[2][i],
                    "paged_kv_last_page_len_buf": buffers[3][i]} if use_cuda_graph else {}),
                backend=backend)
            for i in range(num_levels)]
        self._num_levels = num_levels
        self._scratch: dict | None = None  # the inner levels' out / lse (_scratch_for)
        self._planned = False

    @property
    def level_decisions(self) -> list:
        """Each level's Decision (the kernel that serves it), after ``plan``."""
        return [getattr(w, "decision", None) for w in self._levels]

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffers: Sequence[torch.Tensor]) -> None:
        for w, int_ws in zip(self._levels, int_workspace_buffers):
            w.reset_workspace_buffer(float_workspace_buffer, int_ws)

    @flashinfer_api
    def plan(self, qo_indptr_arr: Sequence[torch.Tensor], paged_kv_indptr_arr: Sequence[torch.Tensor],
             paged_kv_indices_arr: Sequence[torch.Tensor],
             paged_kv_last_page_len: Sequence[torch.Tensor], num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             sm_scale: Optional[float] = None, window_left: int = -1,
             logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type="float16", kv_data_type=None) -> None:
        """One list entry per level (int32 index arrays, as the batch prefill wrapper's plan
        takes them); every level's ``qo_indptr`` must end at the same query count."""
        arrays = {"qo_indptr_arr": qo_indptr_arr, "paged_kv_indptr_arr": paged_kv_indptr_arr,
                  "paged_kv_indices_arr": paged_kv_indices_arr,
                  "paged_kv_last_page_len": paged_kv_last_page_len}
        for name, arr in arrays.items():
            if not isinstance(arr, (list, tuple)) or len(arr) != self._num_levels:
                raise ValueError(f"{name} must be a list of {self._num_levels} tensors (one per "
                                 f"level), got {type(arr).__name__} of "
                                 f"{len(arr) if isinstance(arr, (list, tuple)) else '?'}")
        totals = [int(q[-1]) if isinstance(q, torch.Tensor) and q.numel() else None
                  for q in qo_indptr_arr]
        if len(set(totals)) != 1:
            raise ValueError(f"every level's qo_indptr must cover the same queries (end at the "
                             f"same count), got ends {totals}")
        for i, w in enumerate(self._levels):
            w.plan(qo_indptr_arr[i], paged_kv_indptr_arr[i], paged_kv_indices_arr[i],
                   paged_kv_last_page_len[i], num_qo_heads, num_kv_heads, head_dim, page_size,
                   causal=causal and i == self._num_levels - 1,
                   pos_encoding_mode=pos_encoding_mode,
                   use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                   window_left=window_left, logits_soft_cap=logits_soft_cap,
                   rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                   kv_data_type=kv_data_type)
        self._planned = True

    begin_forward = plan

    @flashinfer_api
    def run(self, q: torch.Tensor, paged_kv_cache) -> torch.Tensor:
        """``out [total_q, H_qo, head_dim]`` in q's dtype: ``q [total_q, H_qo, head_dim]``,
        ``paged_kv_cache`` as the batch prefill wrapper takes it (one cache for every level)."""
        if not self._planned:
            raise RuntimeError("MultiLevelCascadeAttentionWrapper.run() called before plan()")
        out, lse = self._levels[-1].run(q, paged_kv_cache, return_lse=True)
        scratch = self._scratch_for(out)
        for w in self._levels[:-1]:
            o, s = w.run(q, paged_kv_cache, return_lse=True, **scratch)
            merge_state_in_place(out, lse, o, s)
        return out

    def _scratch_for(self, out: torch.Tensor) -> dict:
        """``out`` / ``lse`` buffers for the levels merged into the last one's output (kept
        from run to run of a plan: two allocations fewer per run); none while a CUDA graph is
        being captured before an eager run made them (the graph then keeps its own)."""
        if self._scratch is None or self._scratch["out"].shape != out.shape \
                or self._scratch["out"].dtype != out.dtype:
            if out.is_cuda and torch.cuda.is_current_stream_capturing():
                return {}
            self._scratch = {"out": torch.empty_like(out),
                             "lse": torch.empty(out.shape[:2], dtype=torch.float32,
                                                device=out.device)}
        return self._scratch

    forward = run

    def end_forward(self) -> None:
        """Upstream no-op."""


__all__ = ["MultiLevelCascadeAttentionWrapper"]
