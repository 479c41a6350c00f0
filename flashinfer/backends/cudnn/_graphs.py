"""cuDNN graphs for single-request attention: build, cache, execute. Imports ``cudnn``.

Imported only from inside the registered kernels (the dispatcher imports the adapter package on
machines without ``cudnn``). One SDPA graph per :class:`~.plan.GraphSpec`, kept in an LRU cache;
one cuDNN handle per (thread, device) — cuDNN handles must not be shared between threads — bound
to torch's current stream at every execute; one workspace tensor per (device, stream), grown when
a graph needs more and otherwise reused.

Plans are made with heuristic mode A only. Asking for ``[A, FALLBACK]`` also enumerates the
fallback engines, and on the H200 a paged causal prefill graph built that way produced nothing
for 10 minutes, while the same graph with A alone built in 0.4 s. A graph A cannot serve fails
at ``check_support``/``build_plans`` with an error naming the graph.

Dynamic shapes: where the library supports them for SDPA forward (frontend >= 1.18, cuDNN >=
9.18.1) graphs are built with ``is_dynamic_shape_enabled`` and one kernel cache per device, so a
new sequence length reuses the compiled kernel instead of compiling again (decode sees a new
``kv_len`` every step). If such a build fails and the static build of the same graph succeeds,
dynamic shapes are switched off for the process. ``DYNAMIC_SHAPES = False`` switches them off.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

import cudnn
import torch

from ...attention_params import AttentionParams
from .plan import GraphCache, GraphSpec, bhsd, needs_copy, plan_segments, stats_buffer
from .support import installed_versions

#: Set False to build every graph for its exact shapes (no kernel cache).
DYNAMIC_SHAPES = False
GRAPH_CACHE = GraphCache(maxsize=256)

_DTYPES = {"float16": cudnn.data_type.HALF, "bfloat16": cudnn.data_type.BFLOAT16}
_LOG2E = 1.0 / math.log(2.0)
_MiB = 1 << 20

_local = threading.local()  # .handles: device index -> cudnn handle (per thread)
_kernel_caches: dict[int, object] = {}
_workspaces: dict[tuple[int, int], torch.Tensor] = {}
_lock = threading.Lock()
_dynamic_broken: list[str] = []  # the first failure that switched dynamic shapes off


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


def dynamic_shapes_supported() -> bool:
    versions = installed_versions()
    return (DYNAMIC_SHAPES and not _dynamic_broken and versions is not None
            and versions.frontend >= (1, 18, 0) and (versions.backend or 0) >= 91801)


def _handle(device_index: int, stream: int):
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    handle = handles.get(device_index)
    if handle is None:
        handle = handles[device_index] = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=stream)
    return handle


def _kernel_cache(device_index: int):
    with _lock:
        cache = _kernel_caches.get(device_index)
        if cache is None:
            cache = _kernel_caches[device_index] = cudnn.create_kernel_cache()
        return cache


def _workspace(device: torch.device, stream: torch.cuda.Stream, nbytes: int) -> torch.Tensor:
    """A uint8 CUDA buffer of at least ``nbytes``, reused per (device, stream)."""
    if torch.cuda.is_current_stream_capturing():
        # inside CUDA-graph capture the buffer must come from the graph's pool
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    key = (device.index, stream.cuda_stream)
    with _lock:
        buf = _workspaces.get(key)
        if buf is None or buf.numel() < nbytes:
            size = max(_MiB, -(-nbytes // _MiB) * _MiB)
            buf = _workspaces[key] = torch.empty(size, dtype=torch.uint8, device=device)
        return buf


def _declare(spec: GraphSpec, handle, kernel_cache) -> Entry:
    io = _DTYPES[spec.dtype]
    options = dict(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                   compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    if spec.dynamic_shapes:
        options.update(is_dynamic_shape_enabled=True, kernel_cache=kernel_cache)
    g = cudnn.pygraph(**options)
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


def _build(spec: GraphSpec, handle, kernel_cache) -> Entry:
    entry = _declare(spec, handle, kernel_cache)
    g = entry.graph
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A])  # A only: see the module docstring
    g.check_support()
    g.build_plans()
    return Entry(g, entry.q, entry.k, entry.v, entry.o, entry.stats, int(g.get_workspace_size()))


def _build_any(spec: GraphSpec, handle) -> Entry:
    """Build ``spec``; if a dynamic-shape build fails but the static one works, stay static."""
    try:
        kernel_cache = _kernel_cache(spec.device_index) if spec.dynamic_shapes else None
        return _build(spec, handle, kernel_cache)
    except Exception as exc:  # noqa: BLE001 - re-raised below with the graph named
        first = exc
    if spec.dynamic_shapes:
        try:
            entry = _build(replace(spec, dynamic_shapes=False), handle, None)
        except Exception:  # noqa: BLE001 - report the first failure
            pass
        else:
            _dynamic_broken.append(f"{type(first).__name__}: {first}")
            return entry
    raise RuntimeError(f"cuDNN cannot build an SDPA graph for {spec.describe()}: "
                       f"{type(first).__name__}: {first}") from first


def _entry(spec: GraphSpec, handle) -> Entry:
    # after a dynamic-shape failure the static graph is filed under the dynamic key; later calls
    # ask for static specs, so that entry just ages out of the LRU
    return GRAPH_CACHE.get(spec, lambda: _build_any(spec, handle))


def _operand(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t) if needs_copy(t) else t


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttentionParams
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The canonical single-request kernel (see :mod:`flashinfer.attention_params`)."""
    if params.custom_mask is not None or params.logits_soft_cap > 0 or params.pos_encoding_mode != "NONE":
        raise ValueError("cudnn attention serves no custom_mask, logits_soft_cap or "
                         f"pos_encoding_mode={params.pos_encoding_mode!r}; the dispatcher should not "
                         "have chosen it")
    if not (q.dtype == k.dtype == v.dtype == params.o_dtype) or q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"cudnn attention needs q, k, v and o in one of float16/bfloat16, got "
                         f"q={q.dtype} k={k.dtype} v={v.dtype} o={params.o_dtype}")
    qo_len, num_qo_heads, _ = q.shape
    kv_len = k.shape[0]
    device = q.device
    out = torch.empty(qo_len, num_qo_heads, v.shape[2], dtype=q.dtype, device=device)
    lse = (torch.empty(qo_len, num_qo_heads, dtype=torch.float32, device=device)
           if params.return_lse else None)
    empty_rows, segments = plan_segments(qo_len, kv_len, params.causal, params.window_left)
    if empty_rows:
        out[:empty_rows].zero_()
        if lse is not None:
            lse[:empty_rows].fill_(-math.inf)
    if not segments:
        return out, lse

    k4, v4 = bhsd(_operand(k)), bhsd(_operand(v))
    q = _operand(q)
    dynamic = dynamic_shapes_supported()
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        handle = _handle(device.index, stream.cuda_stream)
        for seg in segments:
            q4 = bhsd(q[seg.start:seg.stop])
            o4 = bhsd(out[seg.start:seg.stop])
            spec = GraphSpec.make(q4, k4, v4, o4, seg, stats=lse is not None,
                                  sm_scale=params.sm_scale, dynamic_shapes=dynamic)
            entry = _entry(spec, handle)
            pack = {entry.q: q4, entry.k: k4, entry.v: v4, entry.o: o4}
            stats = None
            if entry.stats is not None:
                stats = pack[entry.stats] = stats_buffer(seg.rows, num_qo_heads, device)
            entry.graph.execute(pack, _workspace(device, stream, entry.workspace_size), handle=handle)
            if stats is not None:  # natural-log stats [H, S] -> the contract's base-2 lse [S, H]
                torch.mul(stats[0, :, :, 0].t(), _LOG2E, out=lse[seg.start:seg.stop])
    return out, lse


def state() -> dict:
    """Graph-cache counters and the dynamic-shape state (for tests and the probe script)."""
    return {**GRAPH_CACHE.info(), "dynamic_shapes": dynamic_shapes_supported(),
            "dynamic_shapes_disabled_by": _dynamic_broken[0] if _dynamic_broken else None}
