"""cuDNN graphs for batch attention (paged decode, paged and ragged prefill). Imports ``cudnn``.

Imported only from inside the registered planners. :func:`prepare` (host work, before the
plan's upload; :func:`plan` is the one-phase form) buckets the batch (:mod:`.batch_buckets`), makes
what changes per plan, and its ``finish`` fills the device metadata buffers and returns a
:class:`BatchRunner`; the
runner only looks its graph up (built once per bucketed spec and KV-operand geometry — the page
pool is first seen at run) and executes: no host sync, no data-dependent allocation.

Graphs use cuDNN's padding mask (``seq_len_q`` / ``seq_len_kv``), page tables
(``paged_attention_k_table`` / ``_v_table``, ``paged_attention_max_seq_len_kv``) and ragged
offsets on Q/O (prefill) and K/V (ragged op); built with heuristic A only and static shapes, as
in :mod:`._graphs` (same handles and per-stream workspaces).

Metadata: dense decode (one query row per request) makes ``seq_len_kv`` and each request's
first page position on the host (:func:`~.batch_buckets.decode_arrays`); they ride in the plan's
one upload, with the page ids padded by ``Pb`` zeros
(``Prepared.kv_indices_tail``), and ``finish`` queues one gather into the page table; prefill
and multi-query decode build their metadata on the host (:func:`~.batch_buckets.build_metadata`)
and upload it with one non-blocking copy of their own from pinned memory. A wrapper's next plan
with the same graph key rewrites its previous plan's buffers (``BatchPlan.reusable``) instead of
allocating new ones.

CUDA-graph plans (``plan.cuda_graph``): the metadata buffers belong to a store keyed by the
wrapper's fixed index buffers and are rewritten in place at every plan, so a captured run
replays with the new batch. The store's buckets are fixed by
its first plan — pages per request from the capacity of the fixed ``kv_indices`` buffer — and a
later plan that outgrows them raises (the captured graph would be stale).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass

import cudnn
import numpy as np
import torch

from ._graphs import _DTYPES, _LOG2E, _binding, _workspace, build_plans
from ...attention.batch_params import Prepared
from ...attention.batch_params import Tail
from .batch_buckets import (
    RAGGED, BatchSpec, build_metadata, byte_layout, container, decode_arrays, fill_page_table, fits,
    gather_decode_table, kv_key, make_spec, metadata_layout, unpack,
)
from .single_calls import GraphCache

BATCH_GRAPHS = GraphCache(maxsize=64)

_stores: dict[tuple, "_Buffers"] = {}
_stores_lock = threading.Lock()


@dataclass(frozen=True)
class Entry:
    """A built graph, its tensor handles by name, and its workspace size."""

    graph: object
    handles: dict
    workspace_size: int


def _declare(spec: BatchSpec, geometry: tuple, handle) -> Entry:
    io, i32 = _DTYPES[spec.dtype], cudnn.data_type.INT32
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    h = {}

    def column(name, n):
        h[name] = g.tensor(name=name, dim=[n, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32)
        return h[name]

    bb = spec.batch_bucket
    column("seq_len_q", bb)
    column("seq_len_kv", bb)
    q_off = column("q_offsets", bb + 1) if spec.ragged_q else None
    o_off = column("o_offsets", bb + 1) if spec.ragged_q else None
    h["q"] = g.tensor(name="q", dim=spec.q_dims(), stride=spec.q_stride(), data_type=io,
                      ragged_offset=q_off)
    extra = {}
    if spec.page_size:
        k_shape, k_stride, v_shape, v_stride = geometry
        h["k"] = g.tensor(name="k", dim=list(k_shape), stride=list(k_stride), data_type=io)
        h["v"] = g.tensor(name="v", dim=list(v_shape), stride=list(v_stride), data_type=io)
        pb = spec.kv_bucket
        for name in ("k_table", "v_table"):
            h[name] = g.tensor(name=name, dim=spec.table_dims(), stride=[pb, pb, 1, 1], data_type=i32)
        extra = dict(paged_attention_k_table=h["k_table"], paged_attention_v_table=h["v_table"],
                     paged_attention_max_seq_len_kv=spec.max_kv_len)
    else:
        k_off, v_off = column("k_offsets", bb + 1), column("v_offsets", bb + 1)
        h["k"] = g.tensor(name="k", dim=spec.ragged_kv_dims(spec.head_dim_qk),
                          stride=spec.ragged_kv_stride(spec.head_dim_qk), data_type=io,
                          ragged_offset=k_off)
        h["v"] = g.tensor(name="v", dim=spec.ragged_kv_dims(spec.head_dim_vo),
                          stride=spec.ragged_kv_stride(spec.head_dim_vo), data_type=io,
                          ragged_offset=v_off)
    if spec.causal or spec.left_bound is not None:
        extra["diagonal_alignment"] = cudnn.diagonal_alignment.BOTTOM_RIGHT
    if spec.causal:
        extra["diagonal_band_right_bound"] = 0
    if spec.left_bound is not None:
        extra["diagonal_band_left_bound"] = spec.left_bound
    o, stats = g.sdpa(h["q"], h["k"], h["v"], name="sdpa", attn_scale=spec.sm_scale,
                      generate_stats=spec.stats, use_padding_mask=True,
                      seq_len_q=h["seq_len_q"], seq_len_kv=h["seq_len_kv"], **extra)
    o.set_output(True).set_dim(spec.o_dims()).set_stride(spec.o_stride()).set_data_type(io)
    if o_off is not None:
        o.set_ragged_offset(o_off)
    h["o"] = o
    if spec.stats:
        stats.set_output(True).set_dim(spec.stats_dims()).set_stride(spec.stats_stride())
        stats.set_data_type(cudnn.data_type.FLOAT)
        h["stats"] = stats
    return Entry(g, h, 0)


def _build(spec: BatchSpec, geometry: tuple, handle) -> Entry:
    try:
        entry = _declare(spec, geometry, handle)
        size = build_plans(entry.graph)
    except Exception as exc:  # noqa: BLE001 - re-raised with the graph named
        raise RuntimeError(f"cuDNN cannot build a batch SDPA graph for {spec.describe()} "
                           f"(KV operands {geometry}): {type(exc).__name__}: {exc}") from exc
    return Entry(entry.graph, entry.handles, size)


class _Buffers:
    """The device memory one plan's graph reads beyond q/k/v/o, in one allocation: the packed
    metadata (:func:`~.batch_buckets.metadata_layout`), then the page table, the stats and the
    decode scratch rows (uninitialised: padded query rows compute nothing that is kept)."""

    def __init__(self, spec: BatchSpec, device: torch.device, batch_size: int):
        self.spec = spec
        layout, nbytes = metadata_layout(spec)
        extra = {"stats": (torch.float32, spec.stats_dims())}
        if spec.page_size:
            extra["page_table"] = (torch.int32, spec.table_dims())
        if not spec.ragged_q and spec.batch_bucket > batch_size:  # dense decode query, padded
            io = getattr(torch, spec.dtype)
            extra["q_pad"] = (io, (spec.batch_bucket, spec.num_qo_heads, spec.head_dim_qk))
            extra["o_pad"] = (io, (spec.batch_bucket, spec.num_qo_heads, spec.head_dim_vo))
        scratch, size = byte_layout(extra, start=nbytes)
        self.memory = torch.empty(size, dtype=torch.uint8, device=device)
        self.tensors = unpack(self.memory, layout)
        views = unpack(self.memory, scratch)
        self.stats = views["stats"]
        self.page_table = views.get("page_table")
        self.q_pad, self.o_pad = views.get("q_pad"), views.get("o_pad")
        if not spec.ragged_q:  # dense decode: one query row per request, for good
            self.tensors["seq_len_q"].fill_(1)

    def upload(self, meta) -> None:
        """Copy a plan's host metadata (:func:`~.batch_buckets.build_metadata`) into these buffers
        (non-blocking, from pinned memory)."""
        host = meta.flat
        dst = self.memory[:host.numel()]
        if dst.is_cuda:
            dst.copy_(_staged(dst.device, host), non_blocking=True)
            _STAGING[dst.device][1].record()
        else:
            dst.copy_(host)


#: device -> (pinned uint8 host buffer, event recorded after its last copy was queued)
_STAGING: dict[torch.device, tuple[torch.Tensor, torch.cuda.Event]] = {}


def _staged(device: torch.device, flat: torch.Tensor) -> torch.Tensor:
    """``flat`` copied into the reusable pinned buffer of ``device`` (pinning fresh memory
    costs a cudaHostAlloc, most of a plan's host time); waits (rarely) for the previous copy
    out of that buffer to finish before overwriting it."""
    entry = _STAGING.get(device)
    if entry is None or entry[0].numel() < flat.numel():
        if entry is not None:
            entry[1].synchronize()
        size = max(flat.numel(), 2 * entry[0].numel() if entry else 1 << 16)
        entry = _STAGING[device] = (torch.empty(size, dtype=torch.uint8, pin_memory=True),
                                    torch.cuda.Event())
    else:
        entry[1].synchronize()
    staging = entry[0][:flat.numel()]
    # numpy, not Tensor.copy_: on a many-core host torch splits a copy of this size (tens of KB)
    # over its thread pool; waking the pool showed as ~0.35 ms a plan in a profile on the H200's
    # host (plan_profile); a warm pool costs a few microseconds either way
    np.copyto(staging.numpy(), flat.numpy())
    return staging


class BatchRunner:
    """``runner(q, kv, out, lse, scales)``: executes the plan's graph (the batch contract)."""

    def __init__(self, plan, spec: BatchSpec, buffers: _Buffers, dead: bool,
                 seq_len_kv: torch.Tensor | None = None):
        self.plan, self.spec, self.buffers = plan, spec, buffers
        # dense decode reads it from the plan's upload (see prepare())
        self.seq_len_kv = buffers.tensors["seq_len_kv"] if seq_len_kv is None else seq_len_kv
        self.device = plan.device
        self.layout = plan.kv_layout
        self.clear_dead = dead or plan.cuda_graph
        # [(kv geometry, scale), Entry, its operands (:meth:`_operands`)]
        self._last: list | None = None

    def _entry(self, geometry: tuple, scale: float, handle) -> tuple[Entry, tuple]:
        """The graph of this run's K/V geometry and scale, and its :meth:`_operands`."""
        last = self._last
        if last is not None and last[0] == (geometry, scale):
            return last[1], last[2]
        spec = self.spec if scale == self.spec.sm_scale else dataclasses.replace(self.spec, sm_scale=scale)
        entry = BATCH_GRAPHS.get((spec, geometry), lambda: _build(spec, geometry, handle))
        operands = self._operands(entry)
        self._last = [(geometry, scale), entry, operands]
        return entry, operands

    def _operands(self, entry: Entry) -> tuple:
        """``(handles, uids, tail)`` of ``entry``'s variant pack in the order :meth:`_run`
        passes it: q, k, v, o (per call), then this plan's own buffers (``tail``, the same every
        call). ``uids``: the handles' uids (``()`` when the frontend's tensors do not say)."""
        spec, buf, t, h = self.spec, self.buffers, self.buffers.tensors, entry.handles
        fixed = [("seq_len_q", t["seq_len_q"]), ("seq_len_kv", self.seq_len_kv)]
        if spec.page_size:
            fixed += [("k_table", buf.page_table), ("v_table", buf.page_table)]
        else:
            fixed += [("k_offsets", t["k_offsets"]), ("v_offsets", t["v_offsets"])]
        if spec.ragged_q:
            fixed += [("q_offsets", t["q_offsets"]), ("o_offsets", t["o_offsets"])]
        if "stats" in h:
            fixed.append(("stats", buf.stats))
        handles = tuple(h[name] for name in ("q", "k", "v", "o")) + tuple(h[n] for n, _ in fixed)
        return handles, operand_uids(handles), tuple(tensor for _, tensor in fixed)

    def __call__(self, q, kv, out, lse, scales) -> None:
        if scales.sinks is not None:
            raise ValueError("cudnn batch attention serves no sinks; the dispatcher should not "
                             "have chosen it")
        if q.get_device() == torch._C._cuda_getDevice():  # (torch.cuda.current_device, unwrapped)
            self._run(q, kv, out, lse, scales)
        else:
            with torch.cuda.device(q.device):
                self._run(q, kv, out, lse, scales)

    def _run(self, q, kv, out, lse, scales) -> None:
        spec, buf, t = self.spec, self.buffers, self.buffers.tensors
        bound = _binding(q.device.index)
        if spec.page_size:
            known = kv.derived.get("cudnn") if kv.derived is not None else None
            if known is None:  # cuDNN's page containers of this cache and their geometry
                k, v = container(kv.k, self.layout), container(kv.v, self.layout)
                known = (k, v, kv_key(k, v))
                if kv.derived is not None:
                    kv.derived["cudnn"] = known
            k, v, geometry = known
        else:
            k, v = kv.k.contiguous(), kv.v.contiguous()
            geometry = ()
        scale = spec.sm_scale if scales.q_scale == scales.k_scale == 1.0 else (
            self.plan.sm_scale * scales.q_scale * scales.k_scale)
        entry, (handles, uids, tail) = self._entry(geometry, scale, bound.handle)
        q_in = q if q.is_contiguous() else q.contiguous()
        o_run = out if out.is_contiguous() else torch.empty_like(out)
        rows = q.shape[0]
        if buf.q_pad is not None:
            buf.q_pad[:rows].copy_(q_in)
            q_in, o_run = buf.q_pad, buf.o_pad
        workspace = _workspace(bound, q.device, entry.workspace_size)
        execute(entry.graph, handles, (q_in, k, v, o_run) + tail, uids, workspace, bound.handle)
        if buf.o_pad is not None:
            out.copy_(buf.o_pad[:rows])
        elif o_run is not out:
            out.copy_(o_run)
        if scales.v_scale != 1.0:
            out.mul_(scales.v_scale)
        if lse is not None:
            if spec.ragged_q:
                stats = buf.stats.view(spec.batch_bucket, spec.num_qo_heads, spec.qo_bucket)
                picked = stats[t["stats_b"][:rows], :, t["stats_pos"][:rows]]  # [rows, H]
            else:  # one row per request: token t is request t
                picked = buf.stats.view(spec.batch_bucket, spec.num_qo_heads)[:rows]
            torch.mul(picked, _LOG2E, out=lse)
        if self.clear_dead:
            dead = t["dead_rows"][:rows]
            out.masked_fill_(dead[:, None, None], 0)
            if lse is not None:
                lse.masked_fill_(dead[:, None], -math.inf)


def operand_uids(handles: tuple) -> tuple:
    """The uids of a variant pack's graph tensors, in order; ``()`` when the frontend's tensors
    do not say (then :func:`execute` passes the dict)."""
    try:
        return tuple(int(handle.uid) for handle in handles)
    except (AttributeError, TypeError, ValueError):
        return ()


def execute(graph, handles: tuple, buffers: tuple, uids: tuple, workspace: torch.Tensor,
            handle) -> None:
    """``graph.execute`` of the variant pack ``handles[i] -> buffers[i]``, given as buffers in
    ``uids`` order (the frontend's ``tensor_uids=`` form, which keeps what it learnt of the
    operands between calls instead of re-reading a dict); a frontend without that form, or that
    refuses it, gets the dict form from then on."""
    if uids and _ORDERED[0]:
        try:
            graph.execute(buffers, workspace, handle=handle, tensor_uids=uids)
            return
        except (TypeError, ValueError, AttributeError, NotImplementedError):
            _ORDERED[0] = False
    graph.execute(dict(zip(handles, buffers)), workspace, handle=handle)


#: whether :func:`execute` passes the ordered form (``benchmarks/overhead.py`` times both)
_ORDERED = [True]


def _capacity_pages(plan) -> int:
    """Pages the fixed ``kv_indices`` buffer of a CUDA-graph wrapper can hold."""
    t = plan.kv_indices
    return max(1, t.untyped_storage().nbytes() // t.element_size() - t.storage_offset())


def _reused_buffers(plan, spec: BatchSpec) -> _Buffers | None:
    """The buffers the wrapper's previous plan left in ``plan.reusable``, when they have this
    plan's layout (same graph key and the same decode padding): refilled instead of allocated,
    which saves most of the planner's host time."""
    kept = plan.reusable.get("cudnn") if plan.reusable is not None else None
    if kept is None or (kept.spec is not spec and kept.spec != spec):  # holds the device index
        return None
    padded = not spec.ragged_q and spec.batch_bucket > plan.batch_size
    return kept if (kept.q_pad is not None) == padded else None


def _spec_and_buffers(plan) -> tuple[BatchSpec, _Buffers]:
    """The plan's bucketed spec and the device buffers its graph reads: the wrapper's previous
    ones when they fit (``plan.reusable``), a CUDA-graph wrapper's store, or new ones."""
    device = plan.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    min_kv = _capacity_pages(plan) if plan.cuda_graph and plan.op != RAGGED else 1
    spec = make_spec(plan, device_index=index, scale=plan.sm_scale, min_kv=min_kv)
    if not plan.cuda_graph:
        buffers = _reused_buffers(plan, spec)
        if buffers is None:
            buffers = _Buffers(spec, device, plan.batch_size)
            if plan.reusable is not None:
                plan.reusable["cudnn"] = buffers
        return spec, buffers
    key = (plan.op, index, plan.qo_indptr.data_ptr(), plan.kv_indptr.data_ptr())
    with _stores_lock:
        buffers = _stores.get(key)
        if buffers is not None and (dataclasses.replace(buffers.spec, batch_bucket=0, qo_bucket=0,
                                                         kv_bucket=0)
                                    != dataclasses.replace(spec, batch_bucket=0, qo_bucket=0,
                                                           kv_bucket=0)):
            buffers = None  # another geometry on the same buffers: a new capture anyway
        if buffers is not None and not fits(buffers.spec, plan):
            raise ValueError(
                f"cudnn batch attention: this CUDA-graph plan (batch {plan.batch_size}, max "
                f"qo_len {plan.max_qo_len}) outgrows the buckets its wrapper was first planned "
                f"with ({buffers.spec.describe()}); a captured run would be stale. Plan the "
                f"largest batch first, or use a new wrapper.")
        if buffers is None:
            buffers = _stores[key] = _Buffers(spec, device, plan.batch_size)
    return buffers.spec, buffers


def prepare(plan) -> Prepared:
    """The two-phase planner (see :class:`~flashinfer.attention.batch_params.Prepared`).

    Dense decode makes ``seq_len_kv`` and what the page table is gathered from on the host
    (:func:`~.batch_buckets.decode_arrays`): they ride in the plan's one upload (``seq_len_kv``
    into the CUDA-graph store's buffer for a CUDA-graph plan), and ``finish`` queues one
    gather into the page table and, for a request without keys or a CUDA-graph plan, the
    dead-row flags. Prefill and multi-query decode build their metadata in ``finish``
    (:func:`~.batch_buckets.build_metadata`, one upload of their own)."""
    spec, buffers = _spec_and_buffers(plan)
    if spec.ragged_q:
        return Prepared({}, lambda views: _finish_prefill(plan, spec, buffers))
    arrays = decode_arrays(spec, plan)
    fixed = {}
    if plan.cuda_graph:  # the captured graph reads the store's buffers
        fixed = {"seq_len_kv": buffers.tensors["seq_len_kv"].view(-1)}
    uploads = {name: (a, fixed.get(name)) for name, a in arrays.items()}
    return Prepared(uploads, lambda views: _finish_decode(plan, spec, buffers, views),
                    kv_indices_tail=spec.kv_bucket)


def _finish_decode(plan, spec: BatchSpec, buffers: _Buffers, views: dict) -> BatchRunner:
    b = plan.batch_size
    gather_decode_table(buffers.page_table, views["kv_indices_padded"], views["row_starts"])
    dead = bool((plan.kv_lens_host.numpy() == 0).any())
    if dead or plan.cuda_graph:
        torch.eq(plan.kv_lens, 0, out=buffers.tensors["dead_rows"][:b])
    return BatchRunner(plan, spec, buffers, dead,
                       seq_len_kv=views["seq_len_kv"].view(spec.batch_bucket, 1, 1, 1))


def _finish_prefill(plan, spec: BatchSpec, buffers: _Buffers) -> BatchRunner:
    meta = build_metadata(spec, plan)
    buffers.upload(meta)
    if spec.page_size:
        fill_page_table(buffers.page_table, buffers.tensors["page_src"], plan.kv_indices)
    return BatchRunner(plan, spec, buffers, meta.num_dead > 0)


def plan(plan) -> BatchRunner:
    """The one-phase planner, on a complete plan (a runner built outside the wrapper's
    plan()): :func:`prepare`, its uploads sent on their own, then its ``finish``."""
    prep = prepare(plan)
    views = {}
    if prep.kv_indices_tail:
        views["kv_indices_padded"] = Tail(plan.kv_indices, prep.kv_indices_tail).joined()
    for name, (array, target) in prep.uploads.items():
        src = torch.from_numpy(array.joined() if isinstance(array, Tail) else array)
        if target is None:
            views[name] = src.to(plan.device, non_blocking=False)
        else:
            target[:src.shape[0]].copy_(src)
            views[name] = target[:src.shape[0]]
    return prep.finish(views)


def state() -> dict:
    """Counters of the batch graph cache (for tests and the probe script)."""
    return {**BATCH_GRAPHS.info(), "cuda_graph_stores": len(_stores)}
