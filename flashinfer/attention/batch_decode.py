"""Batch decode against a paged KV cache (upstream ``BatchDecodeWithPagedKVCacheWrapper``).

``plan()`` validates the page table on host copies, builds a
:class:`~flashinfer.attention.batch_params.BatchPlan` for op ``batch_decode`` (``q_len_per_req``
queries per request, causal inside a request when > 1), decides, and gets the backend's runner;
``run(q [batch * q_len_per_req, H_qo, D], paged_kv_cache)`` only checks metadata and runs it.
See :mod:`flashinfer.attention.batch_checks` for the shared rules.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import torch

from .. import index_checks
from ..api_logging import flashinfer_api
from .batch_checks import (
    check_fixed_buffer, check_indptr, host_index_arrays, index_array,
    page_indices, paged_kv_lens, plan_dtypes, planned_device_fields, positive_int,
)
from .batch_params import BatchPlan
from .batch_prefill import BatchPrefillWithRaggedKVCacheWrapper
from ..backends.triton.batch_attention import workspace_bound
from .batch_rope import adopt, plan_rotation
from .batch_wrapper import BatchWrapperBase, batch_pos_encoding, set_plan_attributes
from .params import check_rope_scalars
from .plan_module import PlanModule

__all__ = ["BatchDecodeWithPagedKVCacheWrapper", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper"]

#: decode plan()'s legacy positional tail after page_size (upstream order)
_LEGACY_ORDER = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type",
                 "kv_data_type", "o_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta",
                 "non_blocking", "block_tables", "seq_lens", "fixed_split_size", "disable_split_kv",
                 "q_len_per_req")


class BatchDecodeWithPagedKVCacheWrapper(BatchWrapperBase):
    """Decode attention for a batch of requests whose KV lives in a paged cache."""

    _op = "batch_decode"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer: torch.Tensor | None = None,
                 paged_kv_indices_buffer: torch.Tensor | None = None,
                 paged_kv_last_page_len_buffer: torch.Tensor | None = None,
                 backend: str = "auto", jit_args=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        if jit_args is not None:
            raise NotImplementedError("jit_args (JIT attention variants) are not supported")
        self._use_tensor_cores = bool(use_tensor_cores) or backend in ("trtllm-gen", "cute-dsl")
        self._fixed_batch_size = 0
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        if self._use_cuda_graph:
            last = check_fixed_buffer("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer,
                                      self.device)
            self._fixed_batch_size = last.shape[0]
            check_fixed_buffer("paged_kv_indptr_buffer", paged_kv_indptr_buffer, self.device,
                               self._fixed_batch_size + 1)
            check_fixed_buffer("paged_kv_indices_buffer", paged_kv_indices_buffer, self.device)
            self._qo_indptr_buf = torch.empty_like(paged_kv_indptr_buffer)
            self._kv_lens_buf = torch.empty_like(last)

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    @flashinfer_api
    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             *deprecated_positional_args, pos_encoding_mode: str = "NONE", window_left: int = -1,
             window_right: int = 0, logits_soft_cap: float | None = None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None,
             sm_scale: float | None = None, rope_scale: float | None = None,
             rope_theta: float | None = None, non_blocking: bool = True, block_tables=None,
             seq_lens=None, fixed_split_size=None, disable_split_kv: bool = False,
             q_len_per_req: int = 1) -> None:
        """Plan decode for ``batch = len(last_page_len)`` requests (host work; call once per step)."""
        kwargs = dict(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                      logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                      kv_data_type=kv_data_type, o_data_type=o_data_type, data_type=data_type,
                      sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                      non_blocking=non_blocking, block_tables=block_tables, seq_lens=seq_lens,
                      fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
                      q_len_per_req=q_len_per_req)
        if deprecated_positional_args:
            if len(deprecated_positional_args) > len(_LEGACY_ORDER):
                raise TypeError(f"plan() takes at most {7 + len(_LEGACY_ORDER)} positional arguments")
            warnings.warn("passing plan() arguments after page_size positionally is deprecated; use "
                          "keywords", DeprecationWarning, stacklevel=2)
            kwargs.update(zip(_LEGACY_ORDER, deprecated_positional_args))
        replay = ((indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size),
                  {**kwargs, "window_right": window_right})
        self._plan_decode(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                          page_size, window_right=window_right, replay=replay, **kwargs)

    def _plan_decode(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                     page_size, *, pos_encoding_mode, window_left, window_right, logits_soft_cap,
                     q_data_type, kv_data_type, o_data_type, data_type, sm_scale, rope_scale,
                     rope_theta, non_blocking, block_tables, seq_lens, fixed_split_size,
                     disable_split_kv, q_len_per_req, replay) -> None:
        index_checks.poll(self.device)  # index faults the kernels recorded since the last plan()
        self._check_unsupported(window_right=window_right)
        num_qo_heads = positive_int("num_qo_heads", num_qo_heads)
        num_kv_heads = positive_int("num_kv_heads", num_kv_heads)
        head_dim = positive_int("head_dim", head_dim)
        page_size = positive_int("page_size", page_size)
        q_len_per_req = positive_int("q_len_per_req", q_len_per_req)
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if data_type is not None:
            warnings.warn("data_type is deprecated; use q_data_type / kv_data_type",
                          DeprecationWarning, stacklevel=3)
            q_data_type = kv_data_type = data_type if kv_data_type is None else kv_data_type
        q_dtype, kv_dtype, o_dtype, self._fp8_q = plan_dtypes(q_data_type, kv_data_type,
                                                              o_data_type)
        window_left, cap, scale = self._common_scalars(window_left, logits_soft_cap, sm_scale, head_dim)
        rope_scale, rope_theta = check_rope_scalars(rope_scale, rope_theta)
        pos_encoding_mode = batch_pos_encoding(pos_encoding_mode, head_dim)

        indptr_h, last_h = host_index_arrays(("indptr", indptr), ("last_page_len", last_page_len))
        batch = last_h.shape[0]
        if batch < 1:
            raise ValueError("last_page_len must hold at least one request")
        indptr_np, last_np = indptr_h.numpy(), last_h.numpy()
        check_indptr("indptr", indptr_np, batch)
        n_pages = int(indptr_np[-1])
        indices_d, max_page = page_indices("indices", index_array("indices", indices), n_pages,
                                           deferred=True)
        kv_lens_h = paged_kv_lens(indptr_np, last_np, page_size)
        kv_lens_np = kv_lens_h.numpy()
        if q_len_per_req > 1 and bool((kv_lens_np < q_len_per_req).any()):
            raise ValueError(f"q_len_per_req={q_len_per_req} needs every kv length >= q_len_per_req, "
                             f"got {kv_lens_h.tolist()[:16]}")
        if self._use_cuda_graph and batch != self._fixed_batch_size:
            raise ValueError(f"this CUDA-graph wrapper has a fixed batch size {self._fixed_batch_size} "
                             f"(len(paged_kv_last_page_len_buffer)); plan() got {batch}")
        qo_np = np.arange(0, (batch + 1) * q_len_per_req, q_len_per_req, dtype=np.int32)
        qo_h = torch.from_numpy(qo_np)
        dev, graph = self.device, self._use_cuda_graph
        buf = (lambda name: getattr(self, name)) if graph else (lambda name: None)
        on_host = indices_d.device.type == "cpu"
        # numpy for the host arrays: the upload packs them without converting each again
        arrays = {"qo_indptr": qo_np, "kv_indptr": indptr_np, "kv_lens": kv_lens_np,
                  "kv_last_page_len": last_np,
                  "kv_indices": indices_d.numpy() if on_host else indices_d}
        fixed = {"qo_indptr": buf("_qo_indptr_buf"), "kv_indptr": buf("_paged_kv_indptr_buf"),
                 "kv_lens": buf("_kv_lens_buf"), "kv_last_page_len": buf("_paged_kv_last_page_len_buf"),
                 "kv_indices": buf("_paged_kv_indices_buf")}
        self._drop_plan()
        plan = BatchPlan(
            op=self._op, device=dev, batch_size=batch, num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads, head_dim_qk=head_dim, head_dim_vo=head_dim,
            page_size=page_size, kv_layout=self._kv_layout, q_dtype=q_dtype, kv_dtype=kv_dtype,
            o_dtype=o_dtype, causal=q_len_per_req > 1, window_left=window_left,
            logits_soft_cap=cap, sm_scale=scale, q_len_per_req=q_len_per_req,
            qo_indptr_host=qo_h, kv_indptr_host=indptr_h, kv_lens_host=kv_lens_h,
            kv_last_page_len_host=last_h, **planned_device_fields(arrays, fixed),
            total_qo=batch * q_len_per_req, max_qo_len=q_len_per_req,
            max_kv_len=int(kv_lens_np.max()), kv_indices_host=indices_d if on_host else None,
            cuda_graph=graph, workspace=self._workspace_bytes, reusable=self._reusable,
            pos_encoding_mode=pos_encoding_mode, rope_scale=rope_scale, rope_theta=rope_theta)
        rotation = (plan_rotation(self, plan, indices_d, BatchPrefillWithRaggedKVCacheWrapper)
                    if pos_encoding_mode == "ROPE_LLAMA" else None)
        if rotation is None:
            self._finish_plan(plan, max_page, arrays, fixed, non_blocking)
        else:
            adopt(self, plan, rotation, max_page, indices_d)
        set_plan_attributes(self, plan, window_left, replay)
        if self._cached_module is None:
            self._cached_module = PlanModule(self)
        self._plan_info = (batch, n_pages)

    @flashinfer_api
    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale=None, k_scale=None,
            v_scale=None, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
            return_lse: bool = False, enable_pdl=None, window_left: int | None = None,
            sinks: torch.Tensor | None = None, q_len_per_req: int | None = None,
            skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        """``out [batch * q_len_per_req, H_qo, D]`` (and ``lse [.., H_qo]`` float32 base 2)."""
        if args or kv_cache_sf is not None or skip_softmax_threshold_scale_factor is not None:
            raise NotImplementedError("extra run() tensors, kv_cache_sf (NVFP4) and skip-softmax "
                                      "are not supported")
        plan = self._check_run(q, window_left)
        if q_len_per_req is not None and q_len_per_req != plan.q_len_per_req:
            raise ValueError(f"q_len_per_req={q_len_per_req} differs from the planned {plan.q_len_per_req}")
        kv = self._cache_views.kv(paged_kv_cache, plan, self._max_page, self._check_kv, "indices")
        return self._execute(plan, q, kv, q_scale, k_scale, v_scale, out, lse, return_lse, sinks)

    def workspace_size(self, *args, **kwargs) -> tuple[int, int]:
        """``(float_bytes, int_bytes)`` of workspace a :meth:`plan` with these arguments takes
        from the buffers given to the constructor, without planning: the Triton decode's split
        scratch at its largest (the other kernels allocate what they need themselves; nothing
        uses the int buffer). A call plan() would refuse for its arity raises TypeError."""
        bound = inspect.signature(BatchDecodeWithPagedKVCacheWrapper.plan).bind(self, *args,
                                                                                **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        return workspace_bound(len(a["last_page_len"]), positive_int("q_len_per_req",
                                                                     a["q_len_per_req"]),
                               positive_int("num_qo_heads", a["num_qo_heads"]),
                               positive_int("num_kv_heads", a["num_kv_heads"]),
                               positive_int("head_dim", a["head_dim"]), self.device), 0

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None,
                v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None,
                rope_scale=None, rope_theta=None, return_lse=False):
        """Deprecated: ``run()`` after re-planning when a planned value changed."""
        changes = {"pos_encoding_mode": pos_encoding_mode, "window_left": window_left,
                   "logits_soft_cap": 0.0 if logits_soft_cap is None else float(logits_soft_cap)}
        return self._forward(self.run, q, paged_kv_cache, changes=changes, sm_scale=sm_scale,
                             run_kwargs=dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                             return_lse=return_lse))

    def forward_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        return self.forward(q, paged_kv_cache, *args, **kwargs, return_lse=True)


def fast_decode_plan(self, indptr: torch.Tensor, indices: torch.Tensor,
                     last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int,
                     head_dim: int, page_size: int, pos_encoding_mode: str = "NONE",
                     window_left: int = -1, logits_soft_cap: float | None = None,
                     q_data_type=None, kv_data_type=None, data_type=None,
                     sm_scale: float | None = None, rope_scale: float | None = None,
                     rope_theta: float | None = None, non_blocking: bool = True,
                     fixed_split_size=None, disable_split_kv: bool = False,
                     q_len_per_req: int = 1, global_override_indptr_cpu=None) -> None:
    """Upstream's free function bound onto a decode wrapper (SGLang's multi-step draft:
    ``w.begin_forward = functools.partial(fast_decode_plan, w)``): a :meth:`plan` of ``self``
    with upstream's dtype defaults here (``data_type`` fills ``q_data_type`` and
    ``kv_data_type`` where they are None; then q defaults to float16 and kv to q's dtype) and
    ``global_override_indptr_cpu`` (a host copy of ``indptr``) read instead of ``indptr``, so no
    device-to-host copy is made. Upstream also skips copying into a CUDA-graph wrapper's fixed
    buffers; here plan() writes them (the same values), so a captured run() replays the new
    plan either way."""
    if data_type is not None:
        q_data_type = data_type if q_data_type is None else q_data_type
        kv_data_type = data_type if kv_data_type is None else kv_data_type
    q_data_type = "float16" if q_data_type is None else q_data_type
    kv_data_type = q_data_type if kv_data_type is None else kv_data_type
    host_indptr = indptr if global_override_indptr_cpu is None else global_override_indptr_cpu
    BatchDecodeWithPagedKVCacheWrapper.plan(
        self, host_indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
        page_size, pos_encoding_mode=pos_encoding_mode, window_left=window_left,
        logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
        sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
        non_blocking=non_blocking, fixed_split_size=fixed_split_size,
        disable_split_kv=disable_split_kv, q_len_per_req=q_len_per_req)


_RANGES: dict = {}


def get_range_buf(n: int, device) -> torch.Tensor:
    """``arange(n)`` int32 on ``device``, kept per (n, device) (upstream's private
    ``flashinfer.decode._get_range_buf``, which engines call for a decode plan's qo_indptr).
    Treat it as read-only: the same tensor is returned to every caller."""
    device = torch.device(device)
    key = (int(n), device)
    buf = _RANGES.get(key)
    if buf is None:
        buf = _RANGES[key] = torch.arange(int(n), dtype=torch.int32, device=device)
    return buf


def grouped_size_compiled_for_decode_kernels(num_qo_heads: int, num_kv_heads: int) -> bool:
    """Upstream's private probe (``flashinfer.decode._grouped_size_compiled_for_decode_kernels``):
    whether its CUDA-core decode kernels were built for this query-head group size. Every
    group size that divides evenly is served here (True); engines that see False switch
    upstream to its tensor-core kernels, which changes nothing here."""
    return num_kv_heads > 0 and num_qo_heads % num_kv_heads == 0


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """Legacy form: ``use_cuda_graph=True`` with the three fixed buffers, positional."""

    def __init__(self, workspace_buffer: torch.Tensor, indptr_buffer: torch.Tensor,
                 indices_buffer: torch.Tensor, last_page_len_buffer: torch.Tensor,
                 kv_layout: str = "NHD", use_tensor_cores: bool = False, backend: str = "auto"):
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True,
                         use_tensor_cores=use_tensor_cores, paged_kv_indptr_buffer=indptr_buffer,
                         paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer, backend=backend)
