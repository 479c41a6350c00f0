"""Batch prefill: ragged queries against a paged KV cache or ragged K/V (upstream
``BatchPrefillWithPagedKVCacheWrapper`` and ``BatchPrefillWithRaggedKVCacheWrapper``).

Ops ``batch_prefill_paged`` and ``batch_prefill_ragged``. Note the upstream positional orders
differ: paged ``plan(..., sm_scale, window_left, logits_soft_cap, ...)`` vs ragged
``plan(..., window_left, logits_soft_cap, sm_scale, ...)``. A custom mask (flattened per-request
``qo_len x kv_len`` bool blocks, or ``packed_custom_mask`` in little bit order per request)
replaces ``causal``. See :mod:`flashinfer.attention.batch_checks` for the shared rules.
"""

from __future__ import annotations

import inspect

import torch

from .. import index_checks
from ..api_logging import flashinfer_api
from .batch_checks import (
    check_fixed_buffer, check_indptr, host_index_arrays, index_array,
    page_indices, paged_kv_lens, plan_dtypes, planned_device_fields, positive_int,
    unpack_segments,
)
from .batch_params import BatchPlan, KVInput
from .batch_rope import adopt, plan_rotation
from .batch_wrapper import BatchWrapperBase, batch_pos_encoding, set_plan_attributes
from .multi_item import multi_item_mask
from .params import check_rope_scalars
from .plan_module import PlanModule

__all__ = ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"]


class _PrefillBase(BatchWrapperBase):
    def _init_graph(self, qo_indptr_buf, kv_indptr_buf, custom_mask_buf, mask_indptr_buf):
        self._qo_indptr_buf = qo_indptr_buf
        self._custom_mask_buf = custom_mask_buf
        self._mask_indptr_buf = mask_indptr_buf
        self._fixed_batch_size = 0
        self._max_total_num_rows = None
        if self._use_cuda_graph:
            check_fixed_buffer("qo_indptr_buf", qo_indptr_buf, self.device)
            self._fixed_batch_size = qo_indptr_buf.shape[0] - 1
            check_fixed_buffer(kv_indptr_buf[0], kv_indptr_buf[1], self.device, qo_indptr_buf.shape[0])
            self._kv_lens_buf = torch.empty(self._fixed_batch_size, dtype=torch.int32, device=self.device)

    def _plan_prefill(self, *, qo_indptr, kv_indptr, indices, last_page_len, num_qo_heads,
                      num_kv_heads, head_dim_qk, page_size, head_dim_vo, custom_mask,
                      packed_custom_mask, causal, pos_encoding_mode, sm_scale, window_left,
                      logits_soft_cap, q_data_type, kv_data_type, o_data_type, non_blocking,
                      rope_scale, rope_theta, replay,
                      multi_item: tuple = (None, None, 0, None)) -> None:
        index_checks.poll(self.device)  # index faults the kernels recorded since the last plan()
        rope_scale, rope_theta = check_rope_scalars(rope_scale, rope_theta)
        num_qo_heads = positive_int("num_qo_heads", num_qo_heads)
        num_kv_heads = positive_int("num_kv_heads", num_kv_heads)
        head_dim_qk = positive_int("head_dim_qk", head_dim_qk)
        head_dim_vo = head_dim_qk if head_dim_vo is None else positive_int("head_dim_vo", head_dim_vo)
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        q_dtype, kv_dtype, o_dtype, self._fp8_q = plan_dtypes(q_data_type, kv_data_type,
                                                              o_data_type)
        window_left, cap, scale = self._common_scalars(window_left, logits_soft_cap, sm_scale, head_dim_qk)
        pos_encoding_mode = batch_pos_encoding(pos_encoding_mode, head_dim_qk)

        paged = self._op == "batch_prefill_paged"
        kv_name = "paged_kv_indptr" if paged else "kv_indptr"
        named = [("qo_indptr", qo_indptr), (kv_name, kv_indptr)]
        if paged:
            named.append(("paged_kv_last_page_len", last_page_len))
        qo_h, kv_h, *last_h = host_index_arrays(*named)
        check_indptr("qo_indptr", qo_h)
        batch = qo_h.shape[0] - 1
        if batch < 1:
            raise ValueError("qo_indptr must describe at least one request (length >= 2)")
        check_indptr(kv_name, kv_h, batch)
        max_page, indices_h, last_h = -1, None, (last_h[0] if paged else None)
        if paged:
            if last_h.shape[0] != batch:
                raise ValueError(f"paged_kv_last_page_len must have length {batch}, got {last_h.shape[0]}")
            page_size = positive_int("page_size", page_size)
            indices_h, max_page = page_indices(
                "paged_kv_indices", index_array("paged_kv_indices", indices), int(kv_h.numpy()[-1]),
                "paged_kv_indptr", deferred=True)
            kv_lens_h = paged_kv_lens(kv_h, last_h, page_size)
        else:
            page_size = 0
            kv_lens_h = (kv_h[1:] - kv_h[:-1]).to(torch.int32)
        qo_lens_h = qo_h[1:] - qo_h[:-1]
        total_qo = int(qo_h.numpy()[-1])
        if self._use_cuda_graph:
            if batch != self._fixed_batch_size:
                raise ValueError(f"this CUDA-graph wrapper has a fixed batch size {self._fixed_batch_size} "
                                 f"(len(qo_indptr_buf) - 1); plan() got {batch}")
            if self._max_total_num_rows is None:
                self._max_total_num_rows = total_qo
            elif total_qo > self._max_total_num_rows:
                raise ValueError(f"qo_indptr[-1]={total_qo} exceeds the first plan's "
                                 f"{self._max_total_num_rows} rows of this CUDA-graph wrapper")

        if any(t is not None for t in multi_item[:2] + multi_item[3:]):  # (.multi_item)
            if custom_mask is not None or packed_custom_mask is not None:
                raise ValueError("multi-item scoring (prefix_len_ptr, ...) defines the mask itself; "
                                 "custom_mask / packed_custom_mask cannot be given with it")
            custom_mask, causal = multi_item_mask(*multi_item, qo_lens_h, kv_lens_h), True
        dev, graph = self.device, self._use_cuda_graph
        self._drop_plan()
        mask, mask_h = self._mask(custom_mask, packed_custom_mask, qo_lens_h, kv_lens_h, dev, non_blocking)
        buf = (lambda name: getattr(self, name)) if graph else (lambda name: None)
        arrays = {"qo_indptr": qo_h, "kv_indptr": kv_h, "kv_lens": kv_lens_h}
        fixed = {"qo_indptr": buf("_qo_indptr_buf"), "kv_indptr": buf(self._kv_indptr_attr),
                 "kv_lens": buf("_kv_lens_buf")}
        if paged:
            arrays.update(kv_last_page_len=last_h, kv_indices=indices_h)
            fixed.update(kv_last_page_len=buf("_paged_kv_last_page_len_buf"),
                         kv_indices=buf("_paged_kv_indices_buf"))
        plan = BatchPlan(
            op=self._op, device=dev, batch_size=batch, num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk, head_dim_vo=head_dim_vo,
            page_size=page_size, kv_layout=self._kv_layout, q_dtype=q_dtype, kv_dtype=kv_dtype,
            o_dtype=o_dtype, causal=bool(causal) and mask is None, window_left=window_left,
            logits_soft_cap=cap, sm_scale=scale, q_len_per_req=0,
            qo_indptr_host=qo_h, kv_indptr_host=kv_h, kv_lens_host=kv_lens_h,
            kv_last_page_len_host=last_h,
            **{"kv_indices": None, "kv_last_page_len": None, **planned_device_fields(arrays, fixed)},
            total_qo=total_qo, max_qo_len=int(qo_lens_h.numpy().max()), max_kv_len=int(kv_lens_h.numpy().max()),
            kv_indices_host=indices_h if paged and indices_h.device.type == "cpu" else None,
            custom_mask=mask, mask_indptr_host=mask_h, cuda_graph=graph,
            workspace=self._workspace_bytes, reusable=self._reusable,
            pos_encoding_mode=pos_encoding_mode, rope_scale=rope_scale, rope_theta=rope_theta)
        rotation = (plan_rotation(self, plan, indices_h if paged else None,
                                  BatchPrefillWithRaggedKVCacheWrapper)
                    if pos_encoding_mode == "ROPE_LLAMA" else None)
        if rotation is None:
            self._finish_plan(plan, max_page, arrays, fixed, non_blocking)
        else:
            adopt(self, plan, rotation, max_page, indices_h)
        set_plan_attributes(self, plan, window_left, replay)
        self._causal = bool(causal)
        self._kv_rows = int(kv_h[-1])  # ragged: the K/V rows run() needs (paged: pages)
        self._plan_info = (batch, total_qo)
        if paged and self._cached_module is None:
            self._cached_module = PlanModule(self)

    def _mask(self, custom_mask, packed_custom_mask, qo_lens, kv_lens, dev, non_blocking):
        if custom_mask is None and packed_custom_mask is None:
            if self._use_cuda_graph and self._custom_mask_buf is not None:
                raise ValueError("custom_mask_buf was given to this CUDA-graph wrapper, so plan() "
                                 "needs custom_mask (upstream switches to the custom mask mode)")
            return None, None
        sizes = (qo_lens * kv_lens).to(torch.int64)
        mask_h = torch.zeros(sizes.shape[0] + 1, dtype=torch.int32)
        mask_h[1:] = sizes.cumsum(0)
        need = int(mask_h[-1])
        if custom_mask is not None:
            if not isinstance(custom_mask, torch.Tensor) or custom_mask.dtype != torch.bool or custom_mask.dim() != 1:
                raise ValueError(f"custom_mask must be a flattened 1-D bool tensor, got "
                                 f"{getattr(custom_mask, 'dtype', type(custom_mask).__name__)}")
            if custom_mask.shape[0] != need:
                raise ValueError(f"custom_mask must hold sum(qo_len * kv_len) = {need} entries, "
                                 f"got {custom_mask.shape[0]}")
            mask = custom_mask.to(dev, non_blocking=non_blocking)
        else:
            if not isinstance(packed_custom_mask, torch.Tensor) or packed_custom_mask.dtype != torch.uint8:
                raise ValueError("packed_custom_mask must be a uint8 tensor (segment_packbits, little)")
            mask = unpack_segments(packed_custom_mask, sizes.tolist()).to(dev, non_blocking=non_blocking)
        if self._use_cuda_graph and self._custom_mask_buf is not None:
            if need > self._custom_mask_buf.numel():
                raise ValueError(f"custom_mask_buf holds {self._custom_mask_buf.numel()} entries, "
                                 f"the plan needs {need}")
            self._custom_mask_buf.view(-1)[:need].copy_(mask.to(self._custom_mask_buf.dtype))
            if self._mask_indptr_buf is not None:
                self._mask_indptr_buf[:mask_h.shape[0]].copy_(mask_h, non_blocking=non_blocking)
        return mask, mask_h

    def workspace_size(self, *args, **kwargs) -> tuple[int, int]:
        """``(float_bytes, int_bytes)`` of workspace a :meth:`plan` with these arguments takes
        from the buffers given to the constructor, without planning: ``(0, 0)``, as no prefill
        kernel here carves the caller's buffers (each allocates what it needs). A call plan()
        would refuse for its arity raises TypeError."""
        inspect.signature(type(self).plan).bind(self, *args, **kwargs)
        return 0, 0

    def _prefill_forward(self, q, kv: tuple, causal, pos_encoding_mode, window_left,
                         logits_soft_cap, sm_scale, run_kwargs: dict):
        """The deprecated ``forward()``: ``run()`` after re-planning when a planned value
        changed (the subclasses give upstream's two signatures)."""
        changes = {"pos_encoding_mode": pos_encoding_mode, "causal": bool(causal),
                   "window_left": window_left,
                   "logits_soft_cap": 0.0 if logits_soft_cap is None else float(logits_soft_cap)}
        return self._forward(self.run, q, *kv, changes=changes, sm_scale=sm_scale,
                             run_kwargs=run_kwargs)


class BatchPrefillWithPagedKVCacheWrapper(_PrefillBase):
    """Prefill attention: ragged queries against a paged KV cache."""

    _op = "batch_prefill_paged"
    _kv_indptr_attr = "_paged_kv_indptr_buf"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf=None, paged_kv_indptr_buf=None,
                 paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend: str = "auto", jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        if jit_args is not None or jit_kwargs is not None:
            raise NotImplementedError("jit_args / jit_kwargs (JIT attention variants) are not supported")
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        self._init_graph(qo_indptr_buf, ("paged_kv_indptr_buf", paged_kv_indptr_buf),
                         custom_mask_buf, mask_indptr_buf)
        if self._use_cuda_graph:
            check_fixed_buffer("paged_kv_indices_buf", paged_kv_indices_buf, self.device)
            check_fixed_buffer("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf, self.device,
                               self._fixed_batch_size)

    @flashinfer_api
    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None,
             block_tables=None, max_token_per_sequence=None, max_sequence_kv=None,
             fixed_split_size=None, disable_split_kv=False) -> None:
        """Plan for ``len(qo_indptr) - 1`` requests (host work; once per step)."""
        kwargs = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self._plan_prefill(
            qo_indptr=qo_indptr, kv_indptr=paged_kv_indptr, indices=paged_kv_indices,
            last_page_len=paged_kv_last_page_len, num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk, page_size=page_size,
            head_dim_vo=head_dim_vo, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
            causal=causal, pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale,
            window_left=window_left, logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
            kv_data_type=kv_data_type, o_data_type=o_data_type, non_blocking=non_blocking,
            rope_scale=rope_scale, rope_theta=rope_theta, replay=((), kwargs),
            multi_item=(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                        max_item_len_ptr))

    @flashinfer_api
    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale=None, k_scale=None,
            v_scale=None, out=None, lse=None, return_lse: bool = False, enable_pdl=None,
            window_left: int | None = None, sinks=None, kv_cache_sf=None,
            skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None, uses_spcompress=None):
        """``out [qo_indptr[-1], H_qo, head_dim_vo]`` (and ``lse`` float32 base 2)."""
        if args or kv_cache_sf is not None or skip_softmax_threshold_scale_factor is not None:
            raise NotImplementedError("extra run() tensors, kv_cache_sf (NVFP4) and skip-softmax "
                                      "are not supported")
        plan = self._check_run(q, window_left)
        kv = self._cache_views.kv(paged_kv_cache, plan, self._max_page, self._check_kv, "paged_kv_indices")
        return self._execute(plan, q, kv, q_scale, k_scale, v_scale, out, lse, return_lse, sinks)

    def forward(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE",
                use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=-1,
                logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
                return_lse=False):
        """Deprecated (upstream's signature): ``run()`` after re-planning when a planned value
        changed."""
        return self._prefill_forward(q, (paged_kv_cache,), causal, pos_encoding_mode,
                                     window_left, logits_soft_cap, sm_scale,
                                     dict(k_scale=k_scale, v_scale=v_scale, return_lse=return_lse))

    def forward_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        return self.forward(q, paged_kv_cache, *args, **kwargs, return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillBase):
    """Prefill attention: ragged queries against ragged (contiguous per request) K/V."""

    _op = "batch_prefill_ragged"
    _kv_indptr_attr = "_kv_indptr_buf"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf=None, kv_indptr_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend: str = "auto",
                 jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        if jit_args is not None or jit_kwargs is not None:
            raise NotImplementedError("jit_args / jit_kwargs (JIT attention variants) are not supported")
        self._kv_indptr_buf = kv_indptr_buf
        self._init_graph(qo_indptr_buf, ("kv_indptr_buf", kv_indptr_buf), custom_mask_buf,
                         mask_indptr_buf)

    @flashinfer_api
    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, fixed_split_size=None, disable_split_kv=False, seq_lens=None,
             seq_lens_q=None, max_token_per_sequence=None, max_sequence_kv=None, v_indptr=None,
             o_indptr=None) -> None:
        """Plan for ``len(qo_indptr) - 1`` requests (host work; once per step)."""
        if any(t is not None for t in (prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr)):
            raise NotImplementedError(
                "multi-item scoring (prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr) "
                "runs in BatchPrefillWithPagedKVCacheWrapper; upstream's ragged wrapper ignores "
                "these arguments (plain causal attention), so they are refused here")
        kwargs = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self._plan_prefill(
            qo_indptr=qo_indptr, kv_indptr=kv_indptr, indices=None, last_page_len=None,
            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
            page_size=0, head_dim_vo=head_dim_vo, custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask, causal=causal,
            pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale, window_left=window_left,
            logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
            o_data_type=o_data_type, non_blocking=non_blocking, rope_scale=rope_scale,
            rope_theta=rope_theta, replay=((), kwargs))

    @flashinfer_api
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args, q_scale=None,
            k_scale=None, v_scale=None, o_scale=None, out=None, lse=None, return_lse: bool = False,
            enable_pdl=None, kv_cache_sf=None, window_left: int | None = None, sinks=None):
        """``out [qo_indptr[-1], H_qo, head_dim_vo]`` (and ``lse`` float32 base 2)."""
        if args or kv_cache_sf is not None or o_scale not in (None, 1.0):
            raise NotImplementedError("extra run() tensors, kv_cache_sf and o_scale are not supported")
        plan = self._check_run(q, window_left)
        facts = ((k.shape, k.dtype, k.device, v.shape, v.dtype, v.device)
                 if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) else None)
        known, checked = self._checked_kv
        if facts is None or known is not plan or checked != facts:  # (else: as the last run())
            self._check_ragged_kv(k, v, plan)
            self._checked_kv = (plan, facts)
        if plan.kv_layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        return self._execute(plan, q, KVInput(k, v), q_scale, k_scale, v_scale, out, lse,
                             return_lse, sinks)

    def _check_ragged_kv(self, k, v, plan) -> None:
        self._check_kv("k", k, plan)
        self._check_kv("v", v, plan)
        if k.dim() != 3 or v.dim() != 3:
            raise ValueError(f"k and v must be 3-D, got {tuple(k.shape)} and {tuple(v.shape)}")
        if plan.kv_layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        total_kv, ks, vs = self._kv_rows, k.shape, v.shape
        if (ks[0] < total_kv or vs[0] != ks[0] or ks[1] != plan.num_kv_heads
                or vs[1] != plan.num_kv_heads or ks[2] != plan.head_dim_qk
                or vs[2] != plan.head_dim_vo):
            raise ValueError(f"k/v (NHD view {tuple(k.shape)}, {tuple(v.shape)}) must be "
                             f"[>= kv_indptr[-1]={total_kv}, num_kv_heads={plan.num_kv_heads}, "
                             f"{plan.head_dim_qk} / {plan.head_dim_vo}] as planned")

    def forward(self, q, k, v, causal=False, pos_encoding_mode="NONE",
                use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None,
                rope_scale=None, rope_theta=None, return_lse=False):
        """Deprecated (upstream's signature): ``run()`` after re-planning when a planned value
        changed."""
        return self._prefill_forward(q, (k, v), causal, pos_encoding_mode, window_left,
                                     logits_soft_cap, sm_scale, dict(return_lse=return_lse))

    def forward_return_lse(self, q, k, v, *args, **kwargs):
        return self.forward(q, k, v, *args, **kwargs, return_lse=True)
