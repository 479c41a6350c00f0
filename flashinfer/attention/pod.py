"""POD attention (prefill and decode in one step): ``PODWithPagedKVCacheWrapper`` (one prefill
request over contiguous ``k_p`` / ``v_p`` plus a paged decode batch) and
``BatchPODWithPagedKVCacheWrapper`` (a paged prefill batch plus a paged decode batch).

No vendor ships a fused POD kernel. Here the prefill (single or batch prefill wrapper) runs on
a side stream while the decode (batch decode wrapper, tensor-core form as upstream's POD) runs on
the caller's stream, joined before returning, so the memory-bound decode can overlap the
compute-bound prefill (``wrapper.mode`` ``"two_streams"``; ``wrapper.decisions`` the kernels).
``FLASHINFER_POD_RESERVED_SMS`` (read at ``plan``, default 0) makes the prefill's kernels leave
that many SMs to the decode where they can (FA3's ``sm_margin``): a partition instead of a race.
One batch prefill launch over both kinds of request was measured 2.4-2.5x slower than the two
wrappers back to back on the H200 (1 x 4096 prefill + 128 x 4096 decode: 1.87 ms against
0.74; benchmarks/results/compositions_h200_2026-12-04_0145utc.jsonl), so it is not used.

The batch form is not CUDA-graph capturable (upstream's constructor takes no fixed buffers
either; ``run`` under capture raises); the single-prefill form is, with ``use_cuda_graph=True``
and the decode side's buffers. The batch form's prefill side is planned in ``plan`` for
``causal_p=True`` (what engines pass); ``causal_p`` and the mask arrive with ``run``, which
re-plans only when they differ from the planned ones (host work, no synchronisation).
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import envs
from ..api_logging import flashinfer_api
from ..device import reserving_sms
from .batch_checks import host_index_arrays
from .batch_decode import BatchDecodeWithPagedKVCacheWrapper
from .batch_prefill import BatchPrefillWithPagedKVCacheWrapper
from .single import single_prefill_with_kv_cache

_SIDE_STREAMS: dict = {}


def concurrently(first, second, reserve: int = 0):
    """``(first(), second())`` with ``first`` on a side stream of the current device, overlapping
    ``second`` on the current stream; the current stream waits for both (also under CUDA-graph
    capture). ``first``'s kernels leave ``reserve`` SMs free where they can
    (:func:`~flashinfer.device.reserving_sms`). On the CPU: one after the other."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return first(), second()
    main = torch.cuda.current_stream()
    side = _SIDE_STREAMS.get(main.device)
    if side is None:
        side = _SIDE_STREAMS[main.device] = torch.cuda.Stream(main.device)
    side.wait_stream(main)
    with torch.cuda.stream(side), reserving_sms(reserve):
        a = first()
    b = second()
    main.wait_stream(side)
    for t in (a if isinstance(a, tuple) else (a,)):
        if isinstance(t, torch.Tensor):
            t.record_stream(main)  # made on the side stream, used on the caller's
    return a, b


class PODWithPagedKVCacheWrapper:
    """One prefill request (``q_p [qo_len, H_qo, D]`` over contiguous ``k_p`` / ``v_p``) and a
    paged decode batch, in one call. ``plan`` plans the decode side (upstream's signature);
    the prefill runs on a side stream while the decode runs (``mode == "two_streams"``)."""

    mode = "two_streams"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False,
                 paged_kv_indptr_buffer: Optional[torch.Tensor] = None,
                 paged_kv_indices_buffer: Optional[torch.Tensor] = None,
                 paged_kv_last_page_len_buffer: Optional[torch.Tensor] = None,
                 jit_args=None) -> None:
        if jit_args is not None:
            raise NotImplementedError("jit_args (JIT attention variants) are not supported")
        self._decode = BatchDecodeWithPagedKVCacheWrapper(
            float_workspace_buffer, kv_layout, use_cuda_graph, use_tensor_cores=True,
            paged_kv_indptr_buffer=paged_kv_indptr_buffer,
            paged_kv_indices_buffer=paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer)
        self._kv_layout = kv_layout
        self._planned = False
        self.decisions: dict = {}

    @flashinfer_api
    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             pos_encoding_mode: str = "NONE", window_left: int = -1, q_data_type="float16",
             kv_data_type=None, data_type=None, sm_scale: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             non_blocking: bool = True) -> None:
        """The decode side: ``indptr [B+1]``, ``indices``, ``last_page_len [B]`` (int32) as
        the batch decode wrapper's plan takes them."""
        self._decode.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                          page_size, pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                          q_data_type=q_data_type, kv_data_type=kv_data_type, data_type=data_type,
                          sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                          non_blocking=non_blocking)
        self.decisions = {"decode": self._decode.decision}
        self._reserve = envs.POD_RESERVED_SMS.get()
        self._planned = True

    @flashinfer_api
    def run(self, q_p: torch.Tensor, k_p: torch.Tensor, v_p: torch.Tensor, q_d: torch.Tensor,
            paged_kv_cache_d, custom_mask_p: Optional[torch.Tensor] = None,
            packed_custom_mask_p: Optional[torch.Tensor] = None, causal_p: bool = False,
            kv_layout_p: str = "NHD", pos_encoding_mode_p: str = "NONE",
            sm_scale_p: Optional[float] = None, window_left_p: int = -1,
            rope_scale_p: Optional[float] = None, rope_theta_p: Optional[float] = None,
            return_lse_p: bool = False, custom_mask_d=None, packed_custom_mask_d=None,
            causal_d: bool = False, kv_layout_d: str = "NHD", pos_encoding_mode_d: str = "NONE",
            sm_scale_d=None, window_left_d: int = -1, rope_scale_d=None, rope_theta_d=None,
            q_scale=None, k_scale=None, v_scale=None, return_lse_d: bool = False,
            use_fp16_qk_reduction: bool = False, enable_pdl=None, *args):
        """``(out_p [qo_len, H_qo, D], out_d [B, H_qo, D])``. The ``_d`` arguments other than
        the caches and scales are the plan's (upstream ignores them too); no lse is returned,
        as upstream's."""
        if not self._planned:
            raise RuntimeError("PODWithPagedKVCacheWrapper.run() called before plan()")
        if custom_mask_d is not None or packed_custom_mask_d is not None:
            raise NotImplementedError("a custom mask on the decode side is not supported "
                                      "(upstream ignores it)")

        def prefill():
            return single_prefill_with_kv_cache(
                q_p, k_p, v_p, custom_mask=custom_mask_p, packed_custom_mask=packed_custom_mask_p,
                causal=causal_p, kv_layout=kv_layout_p, pos_encoding_mode=pos_encoding_mode_p,
                use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale_p,
                window_left=window_left_p, rope_scale=rope_scale_p, rope_theta=rope_theta_p)

        return concurrently(prefill, lambda: self._decode.run(
            q_d, paged_kv_cache_d, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale),
            self._reserve)

    def end_forward(self) -> None:
        """Upstream no-op."""


class BatchPODWithPagedKVCacheWrapper:
    """A paged prefill batch and a paged decode batch in one call, on two streams (see the
    module note; ``mode`` is ``"prefill"`` / ``"decode"`` when one side has no request)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        self._ws = float_workspace_buffer
        self._kv_layout = kv_layout
        self._decode = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout,
                                                          use_tensor_cores=True)
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._args = None
        self._planned_for = None
        self.mode: str | None = None
        self.decisions: dict = {}

    @flashinfer_api
    def plan(self, qo_indptr_p, kv_indptr_p, kv_indices_p, last_page_len_p, qo_indptr_d,
             kv_indptr_d, kv_indices_d, last_page_len_d, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, page_size: int, pos_encoding_mode: str = "NONE",
             window_left: int = -1, q_data_type="float16", kv_data_type=None, data_type=None,
             sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, non_blocking: bool = True) -> None:
        """Both sides' int32 index arrays (prefill: ``qo_indptr_p [Bp+1]``; decode: one query
        per request, ``qo_indptr_d`` is upstream's and only checked for that)."""
        qo_p, kv_p, last_p, qo_d, kv_d, last_d = host_index_arrays(
            ("qo_indptr_p", qo_indptr_p), ("kv_indptr_p", kv_indptr_p),
            ("last_page_len_p", last_page_len_p), ("qo_indptr_d", qo_indptr_d),
            ("kv_indptr_d", kv_indptr_d), ("last_page_len_d", last_page_len_d))
        batch_d = last_d.shape[0]
        if qo_d.shape[0] != batch_d + 1 or not torch.equal(qo_d, torch.arange(batch_d + 1,
                                                                              dtype=qo_d.dtype)):
            raise ValueError(f"qo_indptr_d must be [0, 1, ..., {batch_d}] (one query per decode "
                             f"request), got {qo_d.tolist()[:16]}")
        ids_p, ids_d = kv_indices_p[:int(kv_p[-1])], kv_indices_d[:int(kv_d[-1])]
        self._sides = (qo_p.shape[0] > 1, batch_d > 0)  # a side without requests is left out
        if self._sides[1]:
            self._decode.plan(
                kv_d, ids_d, last_d, num_qo_heads, num_kv_heads, head_dim, page_size,
                pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                q_data_type=q_data_type, kv_data_type=kv_data_type, data_type=data_type,
                sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                non_blocking=non_blocking)
        common = dict(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      page_size=page_size, pos_encoding_mode=pos_encoding_mode,
                      window_left=window_left, q_data_type=q_data_type,
                      kv_data_type=kv_data_type, sm_scale=sm_scale, rope_scale=rope_scale,
                      rope_theta=rope_theta)
        self._args = {"prefill": (qo_p, kv_p, ids_p, last_p), "common": common}
        self._planned_for = None
        self._rows = (int(qo_p[-1]), batch_d)
        self._reserve = envs.POD_RESERVED_SMS.get()
        if self._sides[0]:  # planned here for causal_p=True, what engines pass: a run() with
            self._planned(True, None, None)  # another causal_p or a mask re-plans

    def _planned(self, causal: bool, mask, packed_mask):
        """The prefill-side wrapper, (re-)planned when causal or the mask changed."""
        key = (causal, id(mask), id(packed_mask))
        w = self._prefill
        if self._planned_for != key:
            qo, kv, ids, last = self._args["prefill"]
            c = self._args["common"]
            w.plan(qo, kv, ids, last, c["num_qo_heads"], c["num_kv_heads"], c["head_dim"],
                   c["page_size"], custom_mask=mask, packed_custom_mask=packed_mask,
                   causal=causal, pos_encoding_mode=c["pos_encoding_mode"],
                   window_left=c["window_left"], sm_scale=c["sm_scale"],
                   rope_scale=c["rope_scale"], rope_theta=c["rope_theta"],
                   q_data_type=c["q_data_type"], kv_data_type=c["kv_data_type"])
            self._planned_for = key
        return w

    @flashinfer_api
    def run(self, q_p: torch.Tensor, paged_kv_cache_p, q_d: torch.Tensor, paged_kv_cache_d,
            custom_mask_p: Optional[torch.Tensor] = None,
            packed_custom_mask_p: Optional[torch.Tensor] = None, causal_p: bool = False,
            q_scale=None, k_scale=None, v_scale=None, return_lse: bool = False,
            use_fp16_qk_reduction: bool = False, enable_pdl=None):
        """``(out_p, out_d)``, or ``((out_p, lse_p), (out_d, lse_d))`` with ``return_lse``:
        ``q_p [qo_indptr_p[-1], H_qo, D]``, ``q_d [B_d, H_qo, D]``."""
        if self._args is None:
            raise RuntimeError("BatchPODWithPagedKVCacheWrapper.run() called before plan()")
        if q_p.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "BatchPODWithPagedKVCacheWrapper.run() is being captured in a CUDA graph; like "
                "upstream's it has no fixed index buffers, so a replay after another plan() would "
                "read freed arrays. Capture PODWithPagedKVCacheWrapper(use_cuda_graph=True, ...) "
                "or the batch prefill and decode wrappers built with use_cuda_graph=True")
        n_p, n_d = self._rows
        for name, t, rows in (("q_p", q_p, n_p), ("q_d", q_d, n_d)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[0] != rows:
                raise ValueError(f"{name} must be [{rows}, H_qo, D] as planned, got "
                                 f"{tuple(getattr(t, 'shape', ())) or type(t).__name__}")
        scales = dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)
        if not all(self._sides):
            return self._one_side(q_p, paged_kv_cache_p, q_d, paged_kv_cache_d, custom_mask_p,
                                  packed_custom_mask_p, causal_p, return_lse, scales)
        self.mode = "two_streams"
        w = self._planned(causal_p, custom_mask_p, packed_custom_mask_p)
        self.decisions = {"prefill": w.decision, "decode": self._decode.decision}
        return concurrently(
            lambda: w.run(q_p, paged_kv_cache_p, return_lse=return_lse, **scales),
            lambda: self._decode.run(q_d, paged_kv_cache_d, return_lse=return_lse, **scales),
            self._reserve)

    def _one_side(self, q_p, cache_p, q_d, cache_d, mask, packed_mask, causal, return_lse,
                  scales):
        """A step with requests on one side only (``mode`` ``"prefill"`` / ``"decode"``): that
        side's wrapper, the other side's outputs empty."""
        if self._sides[0]:
            self.mode, w = "prefill", self._planned(causal, mask, packed_mask)
            self.decisions = {"prefill": w.decision}
            got, q_empty = w.run(q_p, cache_p, return_lse=return_lse, **scales), q_d
        else:
            self.mode = "decode"
            self.decisions = {"decode": self._decode.decision} if self._sides[1] else {}
            got = (self._decode.run(q_d, cache_d, return_lse=return_lse, **scales)
                   if self._sides[1] else None)
            q_empty = q_p
        o = q_empty.new_empty(q_empty.shape)
        empty = (o, torch.empty(o.shape[:2], dtype=torch.float32, device=o.device)) \
            if return_lse else o
        if got is None:
            got = empty
        return (got, empty) if self._sides[0] else (empty, got)

    def end_forward(self) -> None:
        """Upstream no-op."""


__all__ = ["BatchPODWithPagedKVCacheWrapper", "PODWithPagedKVCacheWrapper", "concurrently"]
