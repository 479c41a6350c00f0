"""cuDNN graphs for single-request attention: build, cache, execute. Imports ``cudnn``.

Imported only from inside the registered kernels (the dispatcher imports the adapter package on
machines without ``cudnn``). Each call geometry (:func:`~.plan.call_key`) maps, in an LRU cache,
to its :class:`~.plan.CallPlan` and one built SDPA graph per step, so a repeated call only makes
its views, allocates out/lse/stats and executes. One cuDNN handle per (thread, device) — cuDNN
handles must not be shared between threads — re-bound only when torch's current stream changes;
one workspace tensor per (device, stream), grown when a graph needs more and otherwise reused.

Plans are made with heuristic mode A only. Asking for ``[A, FALLBACK]`` also enumerates the
fallback engines, and on the H200 a paged causal prefill graph built that way produced nothing
for 10 minutes, while the same graph with A alone built in 0.4 s. A graph A cannot serve fails
at ``check_support``/``build_plans`` with an error naming the graph.

Graphs are built for their exact shapes. On the H200 (cuDNN 9.19, cudnn-frontend 1.32,
2026-11-30) graphs built with dynamic shapes (``is_dynamic_shape_enabled`` + a kernel cache) hit
"CUDA error: an illegal memory access" in prefill with qo_len > kv_len, with a window, with head
dim 256, with MQA and in decode, and decode with HND strides returned wrong results (relative
error 1.33); static graphs passed every case and all GPU tests. A static build costs 60-80 ms per
new shape (0.65-1.6 s for the first graph of a kind), so a decode loop that sees a new kv_len
every step pays one build per step.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import cudnn
import torch

from ...attention.params import AttentionParams
from .single_calls import (
    CallPlan, GraphCache, GraphSpec, apply_view, call_key, needs_copy, plan_call,
)

GRAPH_CACHE = GraphCache(maxsize=256)

_DTYPES = {"float16": cudnn.data_type.HALF, "bfloat16": cudnn.data_type.BFLOAT16}
_LOG2E = 1.0 / math.log(2.0)
_MiB = 1 << 20

_local = threading.local()  # .bindings: device index -> _Binding (per thread)
_workspaces: dict[tuple[int, int], torch.Tensor] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class Entry:
    """A built graph and its tensor handles (the variant-pack keys)."""

    graph: object
    q: object
    k: object
    v: object
    o: object
    stats: object | None
    workspace_size: int


@dataclass(frozen=True)
class Prepared:
    """The cached value of one call geometry: its plan and one built graph per step."""

    plan: CallPlan
    entries: tuple[Entry, ...]
    workspace_size: int  # the largest of the entries'


class _Binding:
    """Per (thread, device): the cuDNN handle, the stream it is bound to, that stream's workspace."""

    __slots__ = ("handle", "stream", "workspace")

    def __init__(self, handle):
        self.handle, self.stream, self.workspace = handle, None, None


def _binding(device_index: int) -> _Binding:
    """This thread's handle for the device, bound to torch's current stream."""
    bindings = getattr(_local, "bindings", None)
    if bindings is None:
        bindings = _local.bindings = {}
    bound = bindings.get(device_index)
    if bound is None:
        bound = bindings[device_index] = _Binding(cudnn.create_handle())
    # the raw cudaStream_t, without building a torch.cuda.Stream (inductor's get_raw_stream)
    stream = torch._C._cuda_getCurrentRawStream(device_index)
    if stream != bound.stream:
        cudnn.set_stream(handle=bound.handle, stream=stream)
        bound.stream, bound.workspace = stream, None
    return bound


def _workspace(bound: _Binding, device: torch.device, nbytes: int) -> torch.Tensor:
    """A uint8 CUDA buffer of at least ``nbytes`` for the bound stream."""
    if torch.cuda.is_current_stream_capturing():
        # inside CUDA-graph capture the buffer must come from the graph's pool (a shared buffer
        # could later be replaced by a larger one and freed under the captured graph)
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    buf = bound.workspace
    if buf is None or buf.numel() < nbytes:
        key = (device.index, bound.stream)
        with _lock:
            buf = _workspaces.get(key)
            if buf is None or buf.numel() < nbytes:
                size = max(_MiB, -(-nbytes // _MiB) * _MiB)
                buf = _workspaces[key] = torch.empty(size, dtype=torch.uint8, device=device)
        bound.workspace = buf
    return buf


def _declare(spec: GraphSpec, handle) -> Entry:
    io = _DTYPES[spec.dtype]
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    q = g.tensor(name="q", dim=spec.q_dims(), stride=list(spec.q_stride), data_type=io)
    k = g.tensor(name="k", dim=spec.k_dims(), stride=list(spec.k_stride), data_type=io)
    v = g.tensor(name="v", dim=spec.v_dims(), stride=list(spec.v_stride), data_type=io)
    band = {}
    if spec.causal or spec.left_bound is not None:
        band["diagonal_alignment"] = cudnn.diagonal_alignment.BOTTOM_RIGHT
    if spec.causal:
        band["diagonal_band_right_bound"] = 0
    if spec.left_bound is not None:
        band["diagonal_band_left_bound"] = spec.left_bound
    o, stats = g.sdpa(q, k, v, name="sdpa", attn_scale=spec.sm_scale,
                      generate_stats=spec.stats, **band)
    o.set_output(True).set_dim(spec.o_dims()).set_stride(list(spec.o_stride)).set_data_type(io)
    if spec.stats:
        stats.set_output(True).set_dim(spec.stats_dims()).set_stride(spec.stats_stride())
        stats.set_data_type(cudnn.data_type.FLOAT)
    return Entry(g, q, k, v, o, stats if spec.stats else None, 0)


def build_plans(g) -> int:
    """Validate a declared graph and build its plans with heuristic mode A only (see the module
    docstring); returns its workspace size in bytes. Every cuDNN graph of the adapter ends here."""
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A])
    g.check_support()
    g.build_plans()
    return int(g.get_workspace_size())


def _build(spec: GraphSpec, handle) -> Entry:
    try:
        entry = _declare(spec, handle)
        g = entry.graph
        workspace_size = build_plans(g)
    except Exception as exc:  # noqa: BLE001 - re-raised with the graph named
        raise RuntimeError(f"cuDNN cannot build an SDPA graph for {spec.describe()}: "
                           f"{type(exc).__name__}: {exc}") from exc
    return Entry(g, entry.q, entry.k, entry.v, entry.o, entry.stats, workspace_size)


def _prepare(q, k, v, params: AttentionParams, handle) -> Prepared:
    plan = plan_call(q, k, v, causal=params.causal, window_left=params.window_left,
                     stats=params.return_lse, sm_scale=params.sm_scale)
    entries = tuple(_build(step.spec, handle) for step in plan.steps)
    return Prepared(plan, entries, max((e.workspace_size for e in entries), default=0))


def _operand(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t) if needs_copy(t) else t


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttentionParams
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The canonical single-request kernel (see :mod:`flashinfer.attention.params`)."""
    if params.custom_mask is not None or params.logits_soft_cap > 0 or params.pos_encoding_mode != "NONE":
        raise ValueError("cudnn attention serves no custom_mask, logits_soft_cap or "
                         f"pos_encoding_mode={params.pos_encoding_mode!r}; the dispatcher should not "
                         "have chosen it")
    if not (q.dtype == k.dtype == v.dtype == params.o_dtype) or q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"cudnn attention needs q, k, v and o in one of float16/bfloat16, got "
                         f"q={q.dtype} k={k.dtype} v={v.dtype} o={params.o_dtype}")
    q, k, v = _operand(q), _operand(k), _operand(v)
    if q.device.index == torch.cuda.current_device():
        return _run(q, k, v, params)
    with torch.cuda.device(q.device):
        return _run(q, k, v, params)


def _run(q, k, v, params: AttentionParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    device = q.device
    bound = _binding(device.index)
    key = call_key(q, k, v, causal=params.causal, window_left=params.window_left,
                   stats=params.return_lse, sm_scale=params.sm_scale)
    prepared = GRAPH_CACHE.get(key, lambda: _prepare(q, k, v, params, bound.handle))
    plan = prepared.plan
    out = torch.empty(plan.out_shape, dtype=q.dtype, device=device)
    lse = (torch.empty(plan.out_shape[:2], dtype=torch.float32, device=device)
           if params.return_lse else None)
    if plan.empty_rows:
        out[:plan.empty_rows].zero_()
        if lse is not None:
            lse[:plan.empty_rows].fill_(-math.inf)
    if not plan.steps:
        return out, lse
    workspace = _workspace(bound, device, prepared.workspace_size)
    k4, v4 = apply_view(k, plan.k), apply_view(v, plan.v)
    for step, entry in zip(plan.steps, prepared.entries):
        pack = {entry.q: apply_view(q, step.q), entry.k: k4, entry.v: v4,
                entry.o: apply_view(out, step.o)}
        if entry.stats is None:
            entry.graph.execute(pack, workspace, handle=bound.handle)
            continue
        stats = pack[entry.stats] = torch.empty(step.stats_shape, dtype=torch.float32, device=device)
        entry.graph.execute(pack, workspace, handle=bound.handle)
        # natural-log stats [1, H, S, 1] -> the contract's base-2 lse rows [S, H]
        torch.mul(stats.view(step.stats_shape[1:3]).t(), _LOG2E, out=lse[step.start:step.stop])
    return out, lse


def state() -> dict:
    """Counters of the graph cache (for tests and the probe script)."""
    return GRAPH_CACHE.info()
