"""``BatchMLAPagedAttentionWrapper``: upstream's MLA wrapper (DeepSeek latent attention over a
paged cache; the math and the layouts are in :mod:`flashinfer.attention.mla_params`).

``plan()`` checks the index arrays (host copies of the indptrs and lengths given on a GPU, as
upstream's plan makes; page ids given on a GPU are not read back: the kernels check each id they
read, rule ``MLA_PAGE``), fixes an :class:`~flashinfer.attention.mla_params.MLAPlan`, makes the
Decision of the op ``batch_mla`` and builds the runner; ``run()`` checks tensor metadata,
allocates ``out`` / ``lse`` (unless the runner makes its own output) and calls the runner.

The plan's Decision assumes what engines pass: ``ckv_cache`` / ``kpe_cache`` as views of one
``[pages, page_size, ckv + kpe]`` buffer. A run with separate caches, when the planned kernel
needs the joint one (FlashMLA), is decided again with the feature ``separate_caches`` (once per
plan; ``wrapper.decision`` then names the kernel that ran).

A CUDA-graph wrapper (``use_cuda_graph=True`` with the four fixed buffers) copies the plan's
arrays into them; its runner reads every length and page id from those buffers and its launch
shape is the first plan's (later plans keep the batch size and may not grow the query length).
Its kernel is the first plan's too: a captured graph replays that kernel, so a later plan
whose Decision names another is served by the first one when it can and refused otherwise;
the runners keep what a captured run reads in one store per wrapper (``plan.graph_store``).
Upstream's ``_cached_module.plan`` (SGLang's CUDA-graph fast path) re-plans from its host
arrays and the fixed ``kv_indices`` buffer (:class:`MLAPlanModule`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .. import dispatch
from ..api_logging import flashinfer_api
from ..backend_names import family_spelling
from ..dispatch import Problem
from ..shape_buckets import length_bucket
from ..index_checks import host_check_wanted
from .batch_checks import (canonical_dtype, check_indptr, host_index_arrays, host_index_numpy,
                           index_array, largest_page_id, paged_kv_lens, positive_int, scale_arg)
from .batch_wrapper import adopt_workspace
from .mla_params import MLAPlan, MLAScales, joint_latent
from .upload import PlanUpload

Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KV_DTYPES = Q_DTYPES + (torch.float8_e4m3fn,)
_LN2 = math.log(2.0)
_NO_SCALES = MLAScales()


class BatchMLAPagedAttentionWrapper:
    """Multi-head latent attention over a paged latent cache, planned once per batch.

    ``float_workspace_buffer``: a byte buffer on the device (any dtype; kept for upstream's
    signature). ``use_cuda_graph``: the four keyword buffers are then fixed int32 arrays
    (``qo_indptr [B+1]``, ``kv_indptr [B+1]``, ``kv_indices [max_pages]``, ``kv_len_arr [B]``) the
    plans are copied into. ``backend``: ``"auto"``, or a backend / upstream spelling
    (``"fa2"``, ``"fa3"``, ``"cutlass"``: upstream's kernels, served here by the dispatcher's
    choice; see the README)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, use_cuda_graph: bool = False,
                 qo_indptr: Optional[torch.Tensor] = None, kv_indptr: Optional[torch.Tensor] = None,
                 kv_indices: Optional[torch.Tensor] = None,
                 kv_len_arr: Optional[torch.Tensor] = None, backend: str = "auto") -> None:
        self._workspace_bytes = adopt_workspace(self, float_workspace_buffer, backend)
        backend = family_spelling("mla", backend)
        self._upload = PlanUpload(self.device)
        self._backend = backend
        self._use_cuda_graph = bool(use_cuda_graph)
        buffers = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
                   "kv_len_arr": kv_len_arr}
        if self._use_cuda_graph:
            for name, buf in buffers.items():
                index_array(name, buf)
                if buf.device != self.device:
                    raise ValueError(f"{name} buffer is on {buf.device}, the workspace on "
                                     f"{self.device}")
        self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr, kv_indptr
        self._kv_indices_buf, self._kv_len_arr_buf = kv_indices, kv_len_arr
        self._plan: MLAPlan | None = None
        self._graph_shape: tuple[int, int] | None = None  # (batch, rows per request) captured
        self._graph_kernel: str | None = None  # the kernel a captured graph replays
        self._graph_store: dict | None = {} if self._use_cuda_graph else None
        self._plan_info = None
        self._runner = self._separate = None
        # the run() layouts that passed the checks under this plan, with their runner
        # (_layout: an engine's step repeats one; the checks cost more than the kernel's launch)
        self._checked: dict = {}
        self.decision: dispatch.Decision | None = None
        self._cached_module = None
        self._causal, self._page_size, self._sm_scale = False, None, None
        self._q_data_type = self._kv_data_type = None
        self._head_dim_ckv = self._head_dim_kpe = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @flashinfer_api
    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
             kv_len_arr: torch.Tensor, num_heads: int, head_dim_ckv: int, head_dim_kpe: int,
             page_size: int, causal: bool, sm_scale: float, q_data_type, kv_data_type,
             use_profiler: bool = False) -> None:
        """Plan ``len(kv_len_arr)`` requests: query rows ``qo_indptr [B+1]``, pages
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` holding ``kv_len_arr[b]`` tokens (int32,
        host or device). ``head_dim_kpe`` may be 0 (no RoPE part). ``sm_scale`` is required
        (DeepSeek: ``1 / sqrt(128 + 64)``). ``use_profiler`` is refused (upstream's profiler
        build)."""
        if use_profiler:
            raise NotImplementedError("use_profiler=True (upstream's profiler build) is not "
                                      "supported")
        num_heads = positive_int("num_heads", num_heads)
        head_dim_ckv = positive_int("head_dim_ckv", head_dim_ckv)
        if isinstance(head_dim_kpe, bool) or not isinstance(head_dim_kpe, int) or head_dim_kpe < 0:
            raise ValueError(f"head_dim_kpe must be an int >= 0, got {head_dim_kpe!r}")
        page_size = positive_int("page_size", page_size)
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) \
                or not math.isfinite(sm_scale) or sm_scale <= 0:
            raise ValueError(f"sm_scale must be a finite float > 0, got {sm_scale!r}")
        q_dtype = canonical_dtype("q_data_type", q_data_type, None, Q_DTYPES)
        kv_dtype = canonical_dtype("kv_data_type", kv_data_type, q_dtype, KV_DTYPES)
        # the host math in numpy: a torch op on a small CPU tensor costs several microseconds
        qo, kv, lens = host_index_numpy(("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr),
                                        ("kv_len_arr", kv_len_arr))
        batch = lens.shape[0]
        check_indptr("qo_indptr", qo, batch)
        check_indptr("kv_indptr", kv, batch)
        pages = kv[1:] - kv[:-1]
        # one pass for both bounds: as uint32 a negative length is above every page capacity
        if batch and bool((lens.view("uint32") > pages.astype("int64") * page_size).any()):
            if bool((lens < 0).any()):
                raise ValueError(f"kv_len_arr must be >= 0, got {lens.tolist()[:16]}")
            b = int((lens > pages.astype("int64") * page_size).argmax())
            raise ValueError(f"kv_len_arr[{b}]={int(lens[b])} tokens need "
                             f"{-(-int(lens[b]) // page_size)} pages of {page_size}, but "
                             f"kv_indptr gives request {b} {int(pages[b])}")
        index_array("kv_indices", kv_indices)
        n_pages = int(kv[-1])
        if kv_indices.shape[0] < n_pages:
            raise ValueError(f"kv_indices must hold kv_indptr[-1]={n_pages} page ids, got "
                             f"{kv_indices.shape[0]}")
        ids = kv_indices if kv_indices.shape[0] == n_pages else kv_indices[:n_pages]
        on_host = ids.device.type == "cpu"
        ids_h = ids.numpy() if on_host else None
        if on_host:
            max_id = largest_page_id(ids_h, "kv_indices") if n_pages else -1
        elif host_check_wanted(ids.device):
            max_id = largest_page_id(ids.cpu().numpy(), "kv_indices") if n_pages else -1
        else:  # no read-back: the kernels check each id they read (rule MLA_PAGE)
            max_id = None
        dev, graph = self.device, self._use_cuda_graph
        qo_lens = qo[1:] - qo[:-1]
        max_qo_len = int(qo_lens.max(initial=0))
        if self._use_cuda_graph:
            max_qo_len = self._fix_graph_shape(batch, max_qo_len)
        # decided on the host arrays, so the kernel's own host-built arrays (plan.extra) travel
        # in the plan's one upload
        host_plan = MLAPlan(
            device=dev, batch_size=batch, num_heads=num_heads, head_dim_ckv=head_dim_ckv,
            head_dim_kpe=head_dim_kpe, page_size=page_size, q_dtype=q_dtype, kv_dtype=kv_dtype,
            o_dtype=q_dtype, causal=bool(causal), sm_scale=float(sm_scale), qo_indptr_host=qo,
            kv_indptr_host=kv, kv_len_host=lens, qo_indptr=None, kv_indptr=None,
            kv_indices=ids, kv_len=None, total_qo=int(qo[-1]),
            max_qo_len=max_qo_len, max_kv_len=int(lens.max(initial=0)),
            max_page_id=max_id, cuda_graph=graph, workspace=self._workspace_bytes,
            kv_indices_host=ids_h,
            graph_store=self._graph_store)
        features = (host_plan.causal, max_qo_len > 1,
                    bool(qo_lens.size) and qo_lens.min() != max_qo_len, graph)
        key = ("batch_mla", dev, q_dtype, kv_dtype, num_heads, head_dim_ckv, head_dim_kpe,
               length_bucket(batch), length_bucket(max_qo_len),
               length_bucket(host_plan.max_kv_len), length_bucket(host_plan.total_qo), page_size,
               features)
        self.decision = dispatch.decide_keyed(key, lambda: self._problem(host_plan), self._backend)
        if graph:
            self.decision = self._graph_decision(self.decision, host_plan)
        host_arrays = getattr(self.decision.kernel, "host_arrays", None)
        extra = host_arrays(host_plan) if host_arrays is not None else {}
        arrays = {"qo_indptr": qo, "kv_indptr": kv, "kv_len_arr": lens, **extra}  # (numpy: no
        # .numpy() per array in the upload)
        if on_host:
            arrays["kv_indices"] = ids_h
        fixed = ({"qo_indptr": self._qo_indptr_buf, "kv_indptr": self._kv_indptr_buf,
                  "kv_len_arr": self._kv_len_arr_buf, "kv_indices": self._kv_indices_buf}
                 if graph else {})
        up = self._upload.upload(arrays, fixed, non_blocking=True)  # one copy (plan_upload)
        d_ids = up.get("kv_indices")
        if d_ids is None:  # page ids kept on the device: read in place (a graph's: in its buffer)
            d_ids = ids
            if graph:
                buf = self._kv_indices_buf
                if buf.shape[0] < n_pages:
                    raise ValueError(f"the fixed buffer for kv_indices holds {buf.shape[0]} "
                                     f"entries, the plan needs {n_pages}")
                if buf.data_ptr() != ids.data_ptr():
                    buf[:n_pages].copy_(ids, non_blocking=True)
        if graph:  # the whole fixed buffer, ids given on the host or not: its capacity sizes
            d_ids = self._kv_indices_buf  # what a captured run reads (the same every plan)
        plan = host_plan  # now with its device arrays
        plan.qo_indptr, plan.kv_indptr, plan.kv_len = up["qo_indptr"], up["kv_indptr"], up["kv_len_arr"]
        plan.kv_indices, plan.extra = d_ids, {name: up[name] for name in extra}
        self._runner = self.decision.kernel(plan)
        self._separate = None
        self._checked = {}
        self._plan = plan
        self._causal, self._page_size, self._sm_scale = plan.causal, page_size, plan.sm_scale
        self._q_data_type, self._kv_data_type = q_dtype, kv_dtype
        self._head_dim_ckv, self._head_dim_kpe = head_dim_ckv, head_dim_kpe
        self._plan_info = (batch, plan.total_qo)
        if self._cached_module is None:
            self._cached_module = MLAPlanModule(self)

    def _fix_graph_shape(self, batch: int, max_qo_len: int) -> int:
        """A CUDA-graph wrapper's launch shape is its first plan's (a captured graph replays
        it): the batch stays, and the rows per request may shrink, not grow. Returns the query
        length the plan is launched for."""
        if self._graph_shape is None:
            self._graph_shape = (batch, max_qo_len)
            return max_qo_len
        fixed_batch, fixed_q = self._graph_shape
        if batch != fixed_batch or max_qo_len > fixed_q:
            raise ValueError(
                f"this CUDA-graph wrapper was first planned for {fixed_batch} requests of at most "
                f"{fixed_q} query tokens (the shape a captured graph replays); got {batch} "
                f"requests of up to {max_qo_len}: use one wrapper per graph shape")
        return fixed_q

    def _graph_decision(self, decision: dispatch.Decision, plan: MLAPlan) -> dispatch.Decision:
        """A CUDA-graph wrapper's Decision: its first plan's kernel, which a captured graph
        replays (another kernel's runner would read buffers the graph never touches)."""
        first = self._graph_kernel
        if first is None or decision.name == first:
            self._graph_kernel = decision.name
            return decision
        try:
            return dispatch.decide(self._problem(plan), first)
        except dispatch.NoBackendError as err:
            raise ValueError(
                f"this CUDA-graph wrapper's first plan runs {first} (the kernel a captured graph "
                f"replays), which cannot serve this plan: {err.args[0] if err.args else err}. "
                "Use one wrapper per graph") from None

    def _problem(self, plan: MLAPlan, separate_caches: bool = False) -> Problem:
        features = {"separate_caches"} if separate_caches else set()
        qo_lens = plan.qo_indptr_host[1:] - plan.qo_indptr_host[:-1]
        if qo_lens.size and qo_lens.min() != qo_lens.max():
            features.add("varying_qo_len")
        if plan.causal:
            features.add("causal")
        if plan.max_qo_len > 1:
            features.add("multi_query")
        if plan.kv_dtype == torch.float8_e4m3fn:
            features.add("fp8_kv")
        if plan.cuda_graph:
            features.add("cuda_graph")
        name = lambda d: str(d).removeprefix("torch.")  # noqa: E731
        return Problem.make(
            "batch_mla", plan.device,
            dtypes={"q": name(plan.q_dtype), "kv": name(plan.kv_dtype), "o": name(plan.o_dtype)},
            shape={"num_heads": plan.num_heads, "head_dim_ckv": plan.head_dim_ckv,
                   "head_dim_kpe": plan.head_dim_kpe, "batch_size": length_bucket(plan.batch_size),
                   "max_qo_len": length_bucket(plan.max_qo_len),
                   "max_kv_len": length_bucket(plan.max_kv_len),
                   "total_qo_len": length_bucket(plan.total_qo), "page_size": plan.page_size},
            features=features)

    @flashinfer_api
    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor,
            kpe_cache: torch.Tensor, out: Optional[torch.Tensor] = None,
            lse: Optional[torch.Tensor] = None, return_lse: bool = False,
            profiler_buffer: Optional[torch.Tensor] = None, kv_len: Optional[torch.Tensor] = None,
            page_table: Optional[torch.Tensor] = None, return_lse_base_on_e: bool = False,
            o_scale: Optional[float] = None, *, ckv_scale: Optional[float] = None,
            ckv_scale_arr: Optional[torch.Tensor] = None, kpe_scale: Optional[float] = None):
        """``out [total_qo, H, head_dim_ckv]`` in q's dtype (and ``lse [total_qo, H]`` float32,
        base 2, or base e with ``return_lse_base_on_e``). ``q_nope [total_qo, H,
        head_dim_ckv]``, ``q_pe [total_qo, H, head_dim_kpe]``; ``ckv_cache [pages, page_size,
        head_dim_ckv]``, ``kpe_cache [pages, page_size, head_dim_kpe]`` (3-D, last dim
        contiguous; views of one ``[pages, page_size, 576]`` buffer are fine). fp8 caches need
        ``kpe_scale`` and one of ``ckv_scale`` (float) / ``ckv_scale_arr`` (float32 ``[pages,
        page_size, head_dim_ckv // 128]``). ``profiler_buffer``, ``kv_len``, ``page_table`` and
        ``o_scale`` (upstream's profiler and cutlass-only arguments) are refused."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("BatchMLAPagedAttentionWrapper.run() called before plan()")
        layout = runner = None
        if (lse is None and ckv_scale is None and ckv_scale_arr is None and kpe_scale is None
                and profiler_buffer is None and kv_len is None and page_table is None
                and o_scale is None):  # the common call: its checks hold for its layout
            layout = _layout(q_nope, q_pe, ckv_cache, kpe_cache)
            runner = self._checked.get(layout)
        if runner is None:
            for name, value in (("profiler_buffer", profiler_buffer), ("kv_len", kv_len),
                                ("page_table", page_table), ("o_scale", o_scale)):
                if value is not None:
                    raise NotImplementedError(f"{name} (upstream's profiler / cutlass-backend "
                                              "argument) is not supported; plan() the wrapper")
            self._check_q(plan, q_nope, q_pe)
            self._check_caches(plan, ckv_cache, kpe_cache)
            scales = self._scales(plan, ckv_cache, ckv_scale, ckv_scale_arr, kpe_scale)
            runner = self._runner if joint_latent(ckv_cache, kpe_cache) else self._separate_runner()
            if layout is not None:
                if len(self._checked) >= 64:
                    self._checked.clear()
                self._checked[layout] = runner
        else:
            scales = _NO_SCALES
        o_shape = (plan.total_qo, plan.num_heads, plan.head_dim_ckv)
        if out is None:
            if not getattr(runner, "makes_output", False):
                out = torch.empty(o_shape, dtype=plan.o_dtype, device=plan.device)
        elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != o_shape
              or out.dtype != plan.o_dtype or out.device != plan.device):
            raise ValueError(f"out must be a {plan.o_dtype} tensor of shape {list(o_shape)} on "
                             f"{plan.device}, got {getattr(out, 'dtype', None)} "
                             f"{tuple(getattr(out, 'shape', ()))}")
        want_lse = bool(return_lse) or lse is not None
        if lse is not None and (not isinstance(lse, torch.Tensor)
                                or tuple(lse.shape) != o_shape[:2] or lse.dtype != torch.float32
                                or lse.device != plan.device):
            raise ValueError(f"lse must be a float32 tensor of shape {list(o_shape[:2])} on "
                             f"{plan.device}")
        if want_lse and lse is None:
            lse = torch.empty(o_shape[:2], dtype=torch.float32, device=plan.device)
        out = runner(q_nope, q_pe, ckv_cache, kpe_cache, out, lse if want_lse else None, scales)
        if want_lse and return_lse_base_on_e:
            lse.mul_(_LN2)
        return (out, lse) if return_lse else out

    def _separate_runner(self):
        """The runner for caches that are not views of one buffer: the plan's own when its
        kernel serves them, else the one decided (once per plan) with ``separate_caches``."""
        if "separate_caches" in self.decision.problem.features:
            return self._runner
        if self._separate is None:
            problem = self._problem(self._plan, separate_caches=True)
            self.decision = dispatch.decide(problem, self._backend)
            self._separate = self.decision.kernel(self._plan)
        return self._separate

    @staticmethod
    def _check_q(plan: MLAPlan, q_nope, q_pe) -> None:
        for name, t, dim in (("q_nope", q_nope, plan.head_dim_ckv), ("q_pe", q_pe, plan.head_dim_kpe)):
            want = (plan.total_qo, plan.num_heads, dim)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
                raise ValueError(f"{name} must be [total_qo, num_heads, dim] = {list(want)} as "
                                 f"planned, got {tuple(getattr(t, 'shape', ()))}")
            if t.dtype != plan.q_dtype or t.device != plan.device:
                raise ValueError(f"{name} must be {plan.q_dtype} on {plan.device} as planned, got "
                                 f"{t.dtype} on {t.device}")

    @staticmethod
    def _check_caches(plan: MLAPlan, ckv_cache, kpe_cache) -> None:
        pages = None
        for name, t, dim in (("ckv_cache", ckv_cache, plan.head_dim_ckv),
                             ("kpe_cache", kpe_cache, plan.head_dim_kpe)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[1:] != (plan.page_size, dim):
                raise ValueError(f"{name} must be [pages, page_size={plan.page_size}, {dim}], got "
                                 f"{tuple(getattr(t, 'shape', ()))}")
            if t.dtype != plan.kv_dtype or t.device != plan.device:
                raise ValueError(f"{name} must be {plan.kv_dtype} on {plan.device} as planned, "
                                 f"got {t.dtype} on {t.device}")
            if dim > 1 and t.stride(-1) != 1:
                raise ValueError(f"{name} must have a contiguous last dim, got strides "
                                 f"{tuple(t.stride())}")
            pages = t.shape[0] if pages is None else min(pages, t.shape[0])
        if plan.max_page_id is not None and plan.max_page_id >= pages:
            raise ValueError(f"kv_indices holds page id {plan.max_page_id}, but the caches have "
                             f"{pages} pages")

    @staticmethod
    def _scales(plan: MLAPlan, ckv_cache, ckv_scale, ckv_scale_arr, kpe_scale) -> MLAScales:
        if plan.kv_dtype != torch.float8_e4m3fn:
            if ckv_scale is not None or ckv_scale_arr is not None or kpe_scale is not None:
                raise ValueError("ckv_scale / ckv_scale_arr / kpe_scale apply to an fp8 cache; "
                                 f"this plan's cache is {plan.kv_dtype}")
            return MLAScales()
        if kpe_scale is None or (ckv_scale is None) == (ckv_scale_arr is None):
            raise ValueError("an fp8 cache needs kpe_scale and exactly one of ckv_scale / "
                             "ckv_scale_arr")
        for name, value in (("kpe_scale", kpe_scale), ("ckv_scale", ckv_scale)):
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                      or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a finite float > 0, got {value!r}")
        if ckv_scale_arr is not None:
            want = tuple(ckv_cache.shape[:-1]) + (plan.head_dim_ckv // 128,)
            if (not isinstance(ckv_scale_arr, torch.Tensor) or tuple(ckv_scale_arr.shape) != want
                    or ckv_scale_arr.dtype != torch.float32 or ckv_scale_arr.device != plan.device):
                raise ValueError(f"ckv_scale_arr must be float32 {list(want)} on {plan.device}")
        return MLAScales(None if ckv_scale is None else float(ckv_scale), ckv_scale_arr,
                         float(kpe_scale))


def _layout(q_nope, q_pe, ckv_cache, kpe_cache) -> tuple | None:
    """What run()'s checks read of its four tensors: shapes, strides, dtypes, devices and where
    ``q_pe`` / ``kpe_cache`` start from ``q_nope`` / ``ckv_cache`` (joint or not); None for an
    argument that is not a tensor (the checks then name it)."""
    try:
        return (q_nope.shape, q_nope.stride(), q_nope.dtype, q_nope.device,
                q_pe.shape, q_pe.stride(), q_pe.dtype, q_pe.device,
                q_pe.data_ptr() - q_nope.data_ptr(),
                ckv_cache.shape, ckv_cache.stride(), ckv_cache.dtype, ckv_cache.device,
                kpe_cache.shape, kpe_cache.stride(), kpe_cache.dtype, kpe_cache.device,
                kpe_cache.data_ptr() - ckv_cache.data_ptr())
    except (AttributeError, TypeError):
        return None


class MLAPlanModule:
    """``wrapper._cached_module`` after the first ``plan()``: upstream's compiled MLA plan
    module, whose ``plan(float_ws, int_ws, pinned_ws, qo_indptr, kv_indptr, kv_len_arr,
    num_heads, head_dim_ckv, causal[, use_profiler])`` (also ``plan.default``) SGLang calls in its
    CUDA-graph fast path, after setting ``_page_size`` / ``_sm_scale`` and writing the page ids
    into the fixed ``kv_indices`` buffer. Here it re-plans the wrapper from those host arrays,
    that buffer and the previous plan's head_dim_kpe and dtypes, and returns ``_plan_info``."""

    def __init__(self, wrapper: BatchMLAPagedAttentionWrapper):
        self._wrapper = wrapper
        self.plan = _PlanEntry(self._replan)

    def _replan(self, *args):
        w = self._wrapper
        before = w._plan
        if len(args) not in (9, 10) or not isinstance(args[3], torch.Tensor):
            raise TypeError("_cached_module.plan() takes upstream's 9 positional arguments "
                            "(float_ws, int_ws, pinned_ws, qo_indptr, kv_indptr, kv_len_arr, "
                            f"num_heads, head_dim_ckv, causal), got {len(args)}")
        if w._kv_indices_buf is None:
            raise RuntimeError("_cached_module.plan() reads the page ids from the wrapper's fixed "
                               "kv_indices buffer (a CUDA-graph wrapper); it has none")
        qo_indptr, kv_indptr, kv_len_arr, heads, head_dim_ckv, causal = args[3:9]
        w.plan(qo_indptr, kv_indptr, w._kv_indices_buf, kv_len_arr, int(heads), int(head_dim_ckv),
               before.head_dim_kpe, int(w._page_size), bool(causal), float(w._sm_scale),
               before.q_dtype, before.kv_dtype)
        return w._plan_info


class _PlanEntry:
    """A callable with a ``default`` attribute that is itself (a torch op's overload spelling)."""

    def __init__(self, fn):
        self._fn = fn
        self.default = self

    def __call__(self, *args):
        return self._fn(*args)


class BatchDecodeMlaWithPagedKVCacheWrapper:
    """Upstream's older MLA decode wrapper (deprecated there): one query token per request,
    lengths from ``last_page_len``, the RoPE part 64 wide (upstream's kernel fixes it), no causal
    mask. Planned and run here on a :class:`BatchMLAPagedAttentionWrapper`. ``use_tensor_cores``
    is accepted (a kernel choice upstream; the dispatcher's here). A CUDA-graph wrapper takes
    the three fixed buffers, as upstream; its plan() then needs a capturable MLA kernel."""

    ROPE_DIM = 64

    def __init__(self, float_workspace_buffer: torch.Tensor, use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer: Optional[torch.Tensor] = None,
                 paged_kv_indices_buffer: Optional[torch.Tensor] = None,
                 paged_kv_last_page_len_buffer: Optional[torch.Tensor] = None) -> None:
        graph = bool(use_cuda_graph)
        if graph:
            for name, buf in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                              ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                              ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)):
                index_array(name, buf)
            batch = paged_kv_last_page_len_buffer.shape[0]
            if paged_kv_indptr_buffer.shape[0] != batch + 1:
                raise ValueError(f"paged_kv_indptr_buffer must hold batch + 1 = {batch + 1} "
                                 f"entries, got {paged_kv_indptr_buffer.shape[0]}")
            dev = float_workspace_buffer.device
            fixed = dict(qo_indptr=torch.zeros(batch + 1, dtype=torch.int32, device=dev),
                         kv_indptr=paged_kv_indptr_buffer, kv_indices=paged_kv_indices_buffer,
                         kv_len_arr=torch.zeros(batch, dtype=torch.int32, device=dev))
        else:
            fixed = {}
        self._mla = BatchMLAPagedAttentionWrapper(float_workspace_buffer, graph, **fixed)
        self._use_tensor_cores = bool(use_tensor_cores)
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._fixed_batch_size = (paged_kv_last_page_len_buffer.shape[0] if graph else None)

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._mla.is_cuda_graph_enabled

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    @property
    def decision(self) -> dispatch.Decision | None:
        return self._mla.decision

    @flashinfer_api
    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, head_dim_compressed_kv: int, page_size: int, sm_scale: float,
             window_left: int = -1, logits_soft_cap: Optional[float] = None,
             data_type="float16", q_data_type=None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None) -> None:
        """Plan ``len(last_page_len)`` requests of one query token: pages
        ``indices[indptr[b]:indptr[b+1]]``, the last holding ``last_page_len[b]`` tokens (int32).
        ``data_type``: the cache dtype (``q_data_type`` defaults to it). A window or a soft cap
        is refused (upstream's MLA kernel has neither); ``rope_scale`` / ``rope_theta`` have no
        effect, as upstream (the queries and keys come rotated)."""
        if window_left is not None and window_left != -1:
            raise NotImplementedError(f"window_left={window_left}: MLA decode has no sliding "
                                      "window")
        if logits_soft_cap:
            raise NotImplementedError(f"logits_soft_cap={logits_soft_cap}: MLA decode has no soft "
                                      "cap")
        page_size = positive_int("page_size", page_size)
        indptr_h, last_h = host_index_arrays(("indptr", indptr), ("last_page_len", last_page_len))
        batch = last_h.shape[0]
        check_indptr("indptr", indptr_h, batch)
        lens = paged_kv_lens(indptr_h, last_h, page_size)
        kv_dtype = canonical_dtype("data_type", data_type, None, KV_DTYPES)
        q_dtype = canonical_dtype("q_data_type", q_data_type, kv_dtype, Q_DTYPES)
        self._mla.plan(torch.arange(batch + 1, dtype=torch.int32), indptr_h, indices, lens,
                       num_qo_heads, head_dim_compressed_kv, self.ROPE_DIM, page_size, False,
                       sm_scale, q_dtype, kv_dtype)

    @flashinfer_api
    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, paged_ckv_cache: torch.Tensor,
            paged_kpe_cache: torch.Tensor, q_scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl: bool = False):
        """``out [batch, H, head_dim_compressed_kv]`` (and ``lse [batch, H]`` float32 base 2).
        ``q_scale`` and ``k_scale`` multiply the scores, ``v_scale`` the output (floats)."""
        factor = scale_arg("q_scale", q_scale) * scale_arg("k_scale", k_scale)
        if factor != 1.0:
            q_nope, q_pe = q_nope * factor, q_pe * factor
        result = self._mla.run(q_nope, q_pe, paged_ckv_cache, paged_kpe_cache, out=out, lse=lse,
                               return_lse=return_lse)
        v = scale_arg("v_scale", v_scale)
        if v != 1.0:
            (result[0] if return_lse else result).mul_(v)
        return result

    def run_return_lse(self, *args, **kwargs):
        return self.run(*args, **kwargs, return_lse=True)


__all__ = ["BatchDecodeMlaWithPagedKVCacheWrapper", "BatchMLAPagedAttentionWrapper",
           "MLAPlanModule"]
