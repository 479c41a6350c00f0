"""The plan()/run() machinery the three batch wrappers share (their argument checks are
:mod:`flashinfer.attention.batch_checks`).

The Decision is made before the upload (it needs only host values); a two-phase planner
(``batch_params.Prepared``) adds its own host arrays to the same copy.

``run()`` only checks metadata (shapes, dtypes, devices), allocates ``out``/``lse`` whose sizes
the plan fixed, and calls the runner the plan made: no host sync, no decision.

Run-time features. ``return_lse`` and ``sinks`` are ``run()`` arguments, but the Decision is
made in ``plan()``. plan() therefore decides once per combination of these two features (the
Decision cache makes that a few dict lookups) and builds, in plan(), the runner of every
combination this wrapper's run() calls have used so far (the plain one before the first run),
one runner per distinct kernel. A ``use_cuda_graph`` wrapper builds the runners of all four
combinations, so any run() can be captured. The one case left to run(): a wrapper without
``use_cuda_graph`` that meets a combination for the first time in its life builds that runner
once (a later plan() builds it with the others).
"""

from __future__ import annotations

import itertools
import math
import warnings

import torch

from .. import dispatch
from .batch_checks import FP8_DTYPES, DeviceIdsCheck, PagedCacheViews, scale_arg, workspace_bytes
from .batch_params import BatchPlan, KVInput, RunScales, Tail, bind_device_arrays
from .checks import check_kv_layout, check_pos_encoding_mode
from .params import POS_ENCODING_MODES, check_softmax_scale
from .scales import apply_v_scale, fold_k_scale, head_scales
from .upload import PlanUpload

RUN_FEATURES = ("lse", "sinks")
_NO_FEATURES: frozenset = frozenset()
_UNIT_SCALES = RunScales()


# ------------------------------------------------------------------------------------------
# the shared wrapper

class BatchWrapperBase:
    """plan()/run() machinery of the batch wrappers (subclasses define the public signatures)."""

    _op = ""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str, use_cuda_graph: bool,
                 backend: str):
        self._workspace_bytes = adopt_workspace(self, float_workspace_buffer, backend)
        self._upload = PlanUpload(self.device)
        self._reusable: dict = {}  # planners' buffers kept across plans (BatchPlan.reusable)
        self._kv_layout = check_kv_layout(kv_layout)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._backend = backend
        self._plan: BatchPlan | None = None
        self._plan_info = None
        self._cached_module = None
        self.decision: dispatch.Decision | None = None
        self._choices: dict = {}
        self._problems = None
        self._runners: dict = {}
        self._rotation = None  # a ROPE_LLAMA plan run on rotated copies (batch_rope.py)
        self._run_features_seen: set = {frozenset()}
        self._max_page = -1
        self._fp8_q = None  # the fp8 q dtype run() takes when plan() got one (plan_dtypes)
        self._cache_views = PagedCacheViews()  # paged run(): the caches' checked page views
        # run()'s last checked q (and ragged k / v) facts, with the plan they were checked for
        self._checked_q: tuple = (None, None)
        self._checked_kv: tuple = (None, None)
        self._planned_window_left = -1
        self._replay_args = None
        self._pos_encoding_mode = "NONE"
        self._rope_scale = 1.0
        self._rope_theta = 1e4
        self._causal = False
        self._window_left = -1
        self._logits_soft_cap = 0.0
        self._sm_scale = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None) -> None:
        self._workspace_bytes = workspace_bytes("float_workspace_buffer", float_workspace_buffer)
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = int_workspace_buffer

    def end_forward(self) -> None:
        """Upstream no-op."""

    # ---- plan ----------------------------------------------------------------------------

    @staticmethod
    def _check_unsupported(**extras) -> None:
        for name, value in extras.items():
            if value not in (None, 0, False):
                raise NotImplementedError(f"{name} is not supported by this wrapper yet")

    @staticmethod
    def _common_scalars(window_left, logits_soft_cap, sm_scale, head_dim_qk: int):
        if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < -1:
            raise ValueError(f"window_left must be an int >= -1 (-1 = no window), got {window_left!r}")
        cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
        if not math.isfinite(cap) or cap < 0:
            raise ValueError(f"logits_soft_cap={logits_soft_cap!r} must be >= 0 (0 or None disables it)")
        scale = 1.0 / math.sqrt(head_dim_qk) if sm_scale is None else float(sm_scale)
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"sm_scale={sm_scale!r} must be a finite float > 0")
        check_softmax_scale(scale)
        return window_left, cap, scale

    def _drop_plan(self) -> None:
        """Called by plan() before its first write into the wrapper's device buffers (the
        upload, a fixed mask buffer, a planner's reused buffers): from then on the previous
        plan's arrays may be overwritten, so if this plan() fails, run() must raise instead of
        running the old plan on them."""
        self._plan, self._runners, self._choices, self.decision = None, {}, {}, None
        self._rotation = None

    def _make_problems(self, plan: BatchPlan) -> tuple[list, list, dict]:
        """The Problem of every run-time feature combination of ``plan``: (the combinations,
        their Problems, an empty decide_each() memo)."""
        flags = {"causal": plan.causal, "gqa": plan.num_qo_heads != plan.num_kv_heads,
                 "rope_llama": plan.pos_encoding_mode == "ROPE_LLAMA",
                 "alibi": plan.pos_encoding_mode == "ALIBI",
                 "window": plan.window_left >= 0, "soft_cap": plan.logits_soft_cap > 0,
                 "custom_mask": plan.custom_mask is not None, "fp8_kv": plan.kv_dtype in FP8_DTYPES,
                 "multi_query": plan.q_len_per_req > 1,
                 "head_dim_differs": plan.head_dim_qk != plan.head_dim_vo,
                 "o_dtype_differs": plan.o_dtype != plan.q_dtype,
                 "cuda_graph": plan.cuda_graph and plan.device.type == "cuda"}
        base = {name for name, on in flags.items() if on}
        lb = dispatch.length_bucket
        shape = {"head_dim_qk": plan.head_dim_qk, "head_dim_vo": plan.head_dim_vo,
                 "num_qo_heads": plan.num_qo_heads, "num_kv_heads": plan.num_kv_heads,
                 "batch_size": lb(plan.batch_size), "max_qo_len": lb(plan.max_qo_len),
                 "max_kv_len": lb(plan.max_kv_len), "total_qo_len": lb(plan.total_qo),
                 "page_size": plan.page_size, "q_len_per_req": plan.q_len_per_req}
        dtypes = {"q": plan.q_dtype, "kv": plan.kv_dtype, "o": plan.o_dtype}
        extras = [frozenset(extra) for n in range(len(RUN_FEATURES) + 1)
                  for extra in itertools.combinations(RUN_FEATURES, n)]
        problems = [dispatch.Problem.make(self._op, plan.device, dtypes=dtypes, shape=shape,
                                          features=base | extra, layout=plan.kv_layout)
                    for extra in extras]
        return extras, problems, {}

    def _finish_plan(self, plan: BatchPlan, max_page: int, arrays: dict, fixed: dict,
                     non_blocking: bool) -> None:
        """Decide for every run-time feature combination, upload the index arrays ``arrays``
        (into ``fixed`` buffers where given) together with what two-phase planners prepared
        (:class:`~flashinfer.attention.batch_params.Prepared`), set the plan's device fields,
        build the runners, keep the plan. ``plan`` arrives with its device fields unset (the
        fixed buffers' views for a CUDA-graph wrapper): the Decision needs only host values."""
        lb = dispatch.length_bucket
        # everything the Problems depend on, as plain values: they are rebuilt only when this
        # changes (decide_each() is still consulted, so overrides and env changes apply)
        key = (plan.causal, plan.num_qo_heads, plan.num_kv_heads, plan.window_left >= 0,
               plan.logits_soft_cap > 0, plan.custom_mask is not None, plan.q_len_per_req,
               plan.head_dim_qk, plan.head_dim_vo, plan.q_dtype, plan.kv_dtype, plan.o_dtype,
               plan.cuda_graph and plan.device.type == "cuda", lb(plan.batch_size),
               lb(plan.max_qo_len), lb(plan.max_kv_len), lb(plan.total_qo), plan.page_size,
               plan.device, plan.kv_layout, plan.pos_encoding_mode)
        if self._problems is None or self._problems[0] != key:
            self._problems = (key, *self._make_problems(plan))
        _, extras, problems, memo = self._problems
        choices = dict(zip(extras, dispatch.decide_each(problems, self._backend, memo)))
        first = choices[frozenset()]
        if isinstance(first, Exception):
            raise first
        wanted = choices if plan.cuda_graph else self._run_features_seen
        kernels = {}
        for features in sorted(wanted, key=len):  # the plain combination first: its errors raise
            choice = choices[features]
            if not isinstance(choice, Exception):
                kernels.setdefault((choice.backend, choice.variant), choice.kernel)
        sends, targets, prepared, tail = dict(arrays), dict(fixed), {}, 0
        for key, kernel in kernels.items():
            prepare = getattr(kernel, "prepare", None)
            if prepare is not None:
                prep = prepared[key] = prepare(plan)
                tail = max(tail, prep.kv_indices_tail)
                for name, (array, target) in prep.uploads.items():
                    sends[key, name], targets[key, name] = array, target
        padded = None  # where the padded page ids land (Prepared.kv_indices_tail)
        if tail:
            padded = "kv_indices" if targets.get("kv_indices") is None else "kv_indices_padded"
            sends[padded] = Tail(arrays["kv_indices"], tail)
        for name in ("kv_indices", "kv_indices_padded"):
            # last in the upload: the page ids' count changes nearly every step of a serving
            # loop, so the arrays before them keep their offsets (and cached views)
            if name in sends:
                sends[name] = sends.pop(name)
        views = self._upload.upload(sends, targets, non_blocking)
        device = {name: views[name] for name in arrays}
        if padded == "kv_indices":
            device["kv_indices"] = views["kv_indices"][:arrays["kv_indices"].shape[0]]
        bind_device_arrays(plan, device)
        runners = {}
        for key, kernel in kernels.items():
            prep = prepared.get(key)
            if prep is None:
                runners[key] = kernel(plan)
                continue
            mine = {name: views[key, name] for name in prep.uploads}
            if prep.kv_indices_tail:
                mine["kv_indices_padded"] = views[padded]
            runners[key] = prep.finish(mine)
        if isinstance(max_page, DeviceIdsCheck):  # device page ids: their check ends here
            max_page = max_page.resolve(self._upload)
        self._plan, self._choices, self.decision = plan, choices, first
        self._runners = runners
        self._max_page = max_page

    # ---- run -----------------------------------------------------------------------------

    def _runner_for(self, features: frozenset):
        choice = self._choices[features]
        if isinstance(choice, Exception):
            raise type(choice)(f"run() with {', '.join(sorted(features))}: {choice}") from choice
        key = (choice.backend, choice.variant)
        runner = self._runners.get(key)
        if runner is None:  # first time this wrapper meets the combination (see the module note)
            if self._capturing():
                raise RuntimeError(f"run() with {', '.join(sorted(features))} needs backend "
                                   f"{choice.name}, whose runner this wrapper has not built yet; "
                                   "run it once before capturing a CUDA graph")
            runner = self._runners[key] = choice.kernel(self._plan)
            self._run_features_seen.add(features)
        return runner

    def _capturing(self) -> bool:
        # (torch.cuda.is_current_stream_capturing, unwrapped: every run() asks)
        return self.device.type == "cuda" and torch._C._cuda_isCurrentStreamCapturing()

    def _check_run(self, q: torch.Tensor, window_left) -> BatchPlan:
        plan = self._plan
        if plan is None:
            raise RuntimeError(f"{type(self).__name__}.run() called before plan()")
        if not self._use_cuda_graph and self._capturing():
            raise RuntimeError(
                f"{type(self).__name__}.run() is being captured in a CUDA graph, but the wrapper was "
                "built with use_cuda_graph=False: its index arrays are not fixed buffers, so a replay "
                "would read the arrays of the captured plan. Build it with use_cuda_graph=True and the "
                "fixed buffers (or CUDAGraphBatchDecodeWithPagedKVCacheWrapper)")
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
        facts = (q.shape, q.dtype, q.device, window_left)
        known, checked = self._checked_q
        if known is plan and checked == facts:  # the steady state: as the last run() of this plan
            return plan
        want = (plan.total_qo, plan.num_qo_heads, plan.head_dim_qk)
        if q.shape != want:
            raise ValueError(f"q must have shape [total_qo, num_qo_heads, head_dim_qk] = {list(want)} "
                             f"as planned, got {tuple(q.shape)}")
        if q.dtype != plan.q_dtype and q.dtype != self._fp8_q:
            raise ValueError(f"q dtype {q.dtype} differs from the planned q_data_type "
                             f"{self._fp8_q or plan.q_dtype}")
        if q.device != plan.device:
            raise ValueError(f"q is on {q.device} but the plan is on {plan.device}")
        if window_left is not None and window_left != self._planned_window_left:
            raise ValueError(f"window_left={window_left} differs from the planned "
                             f"window_left={self._planned_window_left}; pass it to plan()")
        self._checked_q = (plan, facts)
        return plan

    def _check_kv(self, name: str, t, plan: BatchPlan) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != plan.kv_dtype:
            raise ValueError(f"{name} dtype {t.dtype} differs from the planned kv_data_type {plan.kv_dtype}")
        if t.device != plan.device:
            raise ValueError(f"{name} is on {t.device} but the plan is on {plan.device}")

    def _execute(self, plan: BatchPlan, q, kv: KVInput, q_scale, k_scale, v_scale, out, lse,
                 return_lse: bool, sinks):
        if q.dtype != plan.q_dtype:  # an fp8 q (plan_dtypes): widened exactly to the plan's
            q = q.to(plan.q_dtype)
        if isinstance(k_scale, torch.Tensor) or isinstance(v_scale, torch.Tensor):  # .scales
            k_heads = head_scales("k_scale", k_scale, plan.num_kv_heads, plan.device)
            v_heads = head_scales("v_scale", v_scale, plan.num_kv_heads, plan.device)
            if k_heads is not None:
                q = fold_k_scale(q, k_heads)
            result = self._execute(plan, q, kv, q_scale, None if k_heads is not None else k_scale,
                                   None if v_heads is not None else v_scale, out, lse,
                                   return_lse, sinks)
            if v_heads is not None:
                apply_v_scale(result[0] if return_lse else result, v_heads)
            return result
        if self._rotation is not None:
            return self._rotation.run(q, kv, q_scale, k_scale, v_scale, out, lse, return_lse,
                                      sinks)
        if q_scale is None and k_scale is None and v_scale is None and sinks is None:
            scales = _UNIT_SCALES
        else:
            scales = RunScales(scale_arg("q_scale", q_scale), scale_arg("k_scale", k_scale),
                               scale_arg("v_scale", v_scale), self._sinks(sinks, plan))
            check_softmax_scale(plan.sm_scale * scales.q_scale * scales.k_scale,
                                "sm_scale * q_scale * k_scale")
        features = (_NO_FEATURES if not return_lse and sinks is None else
                    frozenset(f for f, on in (("lse", return_lse), ("sinks", sinks is not None)) if on))
        runner = self._runner_for(features)
        o_shape = (plan.total_qo, plan.num_qo_heads, plan.head_dim_vo)
        if out is None:
            if plan.o_dtype == q.dtype and getattr(runner, "makes_output", False):
                out = None  # the runner returns its kernel's own output (batch_params)
            elif (plan.head_dim_vo == plan.head_dim_qk and plan.o_dtype == q.dtype
                  and q.is_contiguous()):  # (q's own shape and dtype: the cheaper allocation)
                out = torch.empty_like(q)
            else:
                out = torch.empty(o_shape, dtype=plan.o_dtype, device=plan.device)
        elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != o_shape
              or out.dtype != plan.o_dtype or out.device != plan.device):
            raise ValueError(f"out must be a {plan.o_dtype} tensor of shape {list(o_shape)} on "
                             f"{plan.device}, got {getattr(out, 'dtype', None)} {tuple(getattr(out, 'shape', ()))}")
        lse_buf = None
        if return_lse:
            l_shape = (plan.total_qo, plan.num_qo_heads)
            if lse is None:
                lse_buf = torch.empty(l_shape, dtype=torch.float32, device=plan.device)
            elif (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != l_shape
                  or lse.dtype != torch.float32 or lse.device != plan.device):
                raise ValueError(f"lse must be a float32 tensor of shape {list(l_shape)} on "
                                 f"{plan.device}, got {getattr(lse, 'dtype', None)} {tuple(getattr(lse, 'shape', ()))}")
            else:
                lse_buf = lse
        made = runner(q, kv, out, lse_buf, scales)
        if out is None:
            out = made
        return (out, lse_buf) if return_lse else out

    @staticmethod
    def _sinks(sinks, plan: BatchPlan):
        if sinks is None:
            return None
        if not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (plan.num_qo_heads,):
            raise ValueError(f"sinks must be a tensor of shape [num_qo_heads={plan.num_qo_heads}], got "
                             f"{tuple(getattr(sinks, 'shape', ())) or type(sinks).__name__}")
        if not sinks.is_floating_point() or sinks.device != plan.device:
            raise ValueError(f"sinks must be a float tensor on {plan.device}, got {sinks.dtype} on {sinks.device}")
        return sinks if sinks.dtype == torch.float32 else sinks.float()

    # ---- deprecated forward(): re-plans when a planned value changes ----------------------

    def _forward(self, run, q, *kv, changes: dict, sm_scale, run_kwargs: dict):
        if self._plan is None:
            raise RuntimeError(f"{type(self).__name__}.forward() called before plan()")
        changes["pos_encoding_mode"] = batch_pos_encoding(changes.get("pos_encoding_mode", "NONE"))
        changed = {k: v for k, v in changes.items() if getattr(self, "_" + k) != v}
        if changed:
            if self._capturing():
                raise RuntimeError(f"forward() changes planned values {sorted(changed)} while a CUDA "
                                   "graph is being captured; pass them to plan()")
            warnings.warn(f"forward() re-plans with {changed}; pass these values to plan() instead",
                          DeprecationWarning, stacklevel=3)
            args, kwargs = self._replay_args
            self.plan(*args, **{**kwargs, **changed})
        q_scale = run_kwargs.pop("q_scale", None)
        if sm_scale is not None:
            q_scale = scale_arg("q_scale", q_scale) * float(sm_scale) / self._sm_scale
        return run(q, *kv, q_scale=q_scale, **run_kwargs)

    def begin_forward(self, *args, **kwargs):
        return self.plan(*args, **kwargs)

    def run_return_lse(self, *args, **kwargs):
        return self.run(*args, **kwargs, return_lse=True)


def batch_pos_encoding(mode, head_dim_qk: int | None = None) -> str:
    """plan()'s ``pos_encoding_mode``: ``"NONE"``, ``"ROPE_LLAMA"`` or ``"ALIBI"`` (also as
    upstream's ``PosEncodingMode`` values 0 / 1 / 2; None is ``"NONE"``). ROPE_LLAMA needs an
    even ``head_dim_qk``."""
    if mode is None:
        mode = "NONE"
    elif isinstance(mode, int) and not isinstance(mode, bool) and 0 <= mode < len(POS_ENCODING_MODES):
        mode = POS_ENCODING_MODES[mode]
    mode = check_pos_encoding_mode(mode)
    if mode == "ROPE_LLAMA" and head_dim_qk is not None and head_dim_qk % 2:
        raise ValueError(f"pos_encoding_mode='ROPE_LLAMA' needs an even head_dim_qk, got {head_dim_qk}")
    return mode


def adopt_workspace(wrapper, float_workspace_buffer: torch.Tensor, backend) -> torch.Tensor:
    """A wrapper constructor's common part: checks the workspace (any dtype: its bytes) and the
    ``backend`` argument, sets upstream's workspace attributes and ``device``; returns the
    workspace as bytes."""
    nbytes = workspace_bytes("float_workspace_buffer", float_workspace_buffer)
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    wrapper._float_workspace_buffer = float_workspace_buffer
    wrapper._int_workspace_buffer = None
    wrapper._pin_memory_int_workspace_buffer = None
    wrapper.device = float_workspace_buffer.device
    return nbytes


def set_plan_attributes(wrapper: BatchWrapperBase, plan: BatchPlan, window_left: int,
                        replay_args) -> None:
    """The upstream private attributes engines read after plan()."""
    wrapper._pos_encoding_mode = plan.pos_encoding_mode
    wrapper._rope_scale, wrapper._rope_theta = plan.rope_scale, plan.rope_theta
    wrapper._causal = plan.causal
    wrapper._window_left = window_left
    wrapper._planned_window_left = window_left
    wrapper._logits_soft_cap = plan.logits_soft_cap
    wrapper._sm_scale = plan.sm_scale
    wrapper._replay_args = replay_args


__all__ = ["BatchWrapperBase", "adopt_workspace", "batch_pos_encoding", "set_plan_attributes"]
