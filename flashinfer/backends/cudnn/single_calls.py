"""Pure-Python planning for the cuDNN attention kernels: row segments, graph keys, call plans,
the LRU cache.

Nothing here imports ``cudnn`` or touches a GPU, so all of it is unit-tested on CPU.

Row segments
------------
A cuDNN SDPA graph masks with one diagonal band aligned BOTTOM_RIGHT (query row ``r`` sits at
absolute position ``r_abs = kv_len - qo_len + r``): ``diagonal_band_right_bound = 0`` is the
causal mask and ``diagonal_band_left_bound = window_left + 1`` hides keys ``j < r_abs -
window_left`` (the left bound counts visible keys *including* the diagonal). cuDNN refuses a band
when ``s_q > s_kv``, so when ``qo_len > kv_len`` the rows are split into segments, each run as
its own graph on a row slice of ``q`` / ``out`` (views, no copy):

* causal: rows ``r_abs < 0`` see no key at all; they are not run (output 0, lse ``-inf``, the
  contract of :mod:`flashinfer.attention.params`), the others form one segment of ``kv_len``
  rows;
* window without causal: rows ``r_abs < 0`` see every key (unmasked segment), the last
  ``kv_len`` rows run with the left bound only.

A window that can hide nothing (``window_left >= kv_len - 1``) is dropped, and a single query
row (decode) needs no causal mask: fewer graph variants.

Call plans
----------
:func:`plan_call` turns one call's geometry (shapes, strides, mask, scale) into a
:class:`CallPlan`: the segments, the :class:`GraphSpec` of each, and every ``[1, H, S, D]`` view
as ``(size, stride, offset)``. The kernel caches it with the built graphs under that geometry, so
a repeated call only re-applies the views (:func:`apply_view`) to its new tensors.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

import torch


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, stop)`` of q/out run as one graph with this band."""

    start: int
    stop: int
    causal: bool
    left_bound: int | None  # cuDNN diagonal_band_left_bound, None = no left bound

    @property
    def rows(self) -> int:
        return self.stop - self.start


def plan_segments(qo_len: int, kv_len: int, causal: bool, window_left: int
                  ) -> tuple[int, tuple[Segment, ...]]:
    """``(empty_rows, segments)``: rows ``[0, empty_rows)`` see no key; segments cover the rest.

    ``window_left < 0`` means no window. See the module docstring for the rules.
    """
    if qo_len <= 0:
        return 0, ()
    if kv_len <= 0:
        return qo_len, ()
    left = window_left + 1 if 0 <= window_left < kv_len - 1 else None
    if qo_len == 1:
        # one row at r_abs = kv_len - 1: a causal band hides nothing; with a window, a causal-like
        # band (right bound 0) is the form every cuDNN version with windows supports
        return 0, (Segment(0, 1, left is not None, left),)
    overhang = max(0, qo_len - kv_len)  # rows with r_abs < 0
    if causal:
        if overhang == qo_len:
            return qo_len, ()
        return overhang, (Segment(overhang, qo_len, True, left),)
    if left is None:
        return 0, (Segment(0, qo_len, False, None),)
    if overhang:
        return 0, (Segment(0, overhang, False, None), Segment(overhang, qo_len, False, left))
    return 0, (Segment(0, qo_len, False, left),)


@dataclass(frozen=True)
class GraphSpec:
    """Everything one SDPA graph depends on; hashable, used as the graph-cache key.

    Tensor geometry is given as the ``[1, H, S, D]`` (BHSD) views the graph is declared with and
    executed on, so NHD and HND inputs differ only in their strides.
    """

    device_index: int
    dtype: str  # "float16" | "bfloat16" (q, k, v and o)
    num_qo_heads: int
    num_kv_heads: int
    qo_rows: int
    kv_len: int
    head_dim_qk: int
    head_dim_vo: int
    q_stride: tuple[int, ...]
    k_stride: tuple[int, ...]
    v_stride: tuple[int, ...]
    o_stride: tuple[int, ...]
    causal: bool
    left_bound: int | None
    stats: bool
    sm_scale: float

    @staticmethod
    def make(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, o4: torch.Tensor,
             segment: Segment, *, stats: bool, sm_scale: float) -> "GraphSpec":
        """Key of the graph for BHSD views ``q4 [1,Hq,S,Dqk]``, ``k4``/``v4 [1,Hkv,L,D]``, ``o4``."""
        index = q4.device.index if q4.device.type == "cuda" else -1
        return GraphSpec(
            device_index=-1 if index is None else index,
            dtype=str(q4.dtype).removeprefix("torch."),
            num_qo_heads=q4.shape[1], num_kv_heads=k4.shape[1],
            qo_rows=q4.shape[2], kv_len=k4.shape[2],
            head_dim_qk=q4.shape[3], head_dim_vo=v4.shape[3],
            q_stride=tuple(q4.stride()), k_stride=tuple(k4.stride()),
            v_stride=tuple(v4.stride()), o_stride=tuple(o4.stride()),
            causal=segment.causal, left_bound=segment.left_bound,
            stats=stats, sm_scale=float(sm_scale),
        )

    def q_dims(self) -> list[int]:
        return [1, self.num_qo_heads, self.qo_rows, self.head_dim_qk]

    def k_dims(self) -> list[int]:
        return [1, self.num_kv_heads, self.kv_len, self.head_dim_qk]

    def v_dims(self) -> list[int]:
        return [1, self.num_kv_heads, self.kv_len, self.head_dim_vo]

    def o_dims(self) -> list[int]:
        return [1, self.num_qo_heads, self.qo_rows, self.head_dim_vo]

    def stats_dims(self) -> list[int]:
        return [1, self.num_qo_heads, self.qo_rows, 1]

    def stats_stride(self) -> list[int]:
        """Contiguous ``[1, H, S, 1]`` (head-major), the layout every dense cuDNN SDPA caller uses;
        the kernel then writes ``stats.t() * log2(e)`` into the caller's ``[S, H]`` lse rows."""
        return [self.num_qo_heads * self.qo_rows, self.qo_rows, 1, 1]

    def describe(self) -> str:
        band = ("causal" if self.causal else "no causal") + (
            f", left bound {self.left_bound}" if self.left_bound is not None else "")
        return (f"{self.dtype} q[1,{self.num_qo_heads},{self.qo_rows},{self.head_dim_qk}] "
                f"kv[1,{self.num_kv_heads},{self.kv_len},{self.head_dim_qk}/{self.head_dim_vo}] "
                f"{band}, stats={self.stats}, scale={self.sm_scale:g}, cuda:{self.device_index}")


def bhsd(t: torch.Tensor) -> torch.Tensor:
    """``[S, H, D]`` → the ``[1, H, S, D]`` view cuDNN is declared with and reads (no copy).

    Strides of size-1 dims are canonical (a lone row is laid out like NHD, a lone head like HND)
    and the batch stride spans the whole tensor, so equal layouts get one graph and no two dims
    of size > 1 share a stride.
    """
    s, h, d = t.shape
    ss, sh, sd = t.stride()
    if s == 1:
        ss = max(h * sh, d * sd)
    if h == 1:
        sh = max(s * ss, d * sd)
    span = max(s * ss, h * sh, d * sd)
    return t.as_strided((1, h, s, d), (span, sh, ss, sd))


#: ``(size, stride, storage offset relative to the base tensor)`` of a view
View = tuple[tuple[int, ...], tuple[int, ...], int]


def view_of(t: torch.Tensor, base: torch.Tensor) -> View:
    """The geometry of ``t``, a view of ``base``, as :func:`apply_view` re-applies it."""
    return tuple(t.shape), tuple(t.stride()), t.storage_offset() - base.storage_offset()


def apply_view(base: torch.Tensor, view: View) -> torch.Tensor:
    """The view of ``base`` that :func:`view_of` recorded on a tensor of the same geometry."""
    size, stride, offset = view
    return base.as_strided(size, stride, base.storage_offset() + offset)


@dataclass(frozen=True)
class Step:
    """One graph of a call: rows ``[start, stop)`` of q/out, as the views the graph reads."""

    spec: GraphSpec
    start: int
    stop: int
    q: View
    o: View
    stats_shape: tuple[int, ...] | None  # the contiguous ``[1, H, S, 1]`` float32 stats buffer


@dataclass(frozen=True)
class CallPlan:
    """Everything a call needs beyond its tensors: empty rows, out shape, k/v views, steps."""

    empty_rows: int
    out_shape: tuple[int, int, int]  # ``[qo_len, Hq, D_vo]``, contiguous; lse is ``out_shape[:2]``
    k: View
    v: View
    steps: tuple[Step, ...]


def plan_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              window_left: int, stats: bool, sm_scale: float) -> CallPlan:
    """Plan a call on ``q [qo_len, Hq, Dqk]``, ``k/v [kv_len, Hkv, D]`` (cuDNN-ready operands).

    Depends only on the tensors' dtype, device, shapes and strides and on the other arguments,
    never on the data, so the result is reused for every call with the same geometry.
    """
    qo_len, num_qo_heads, _ = q.shape
    out_shape = (qo_len, num_qo_heads, v.shape[2])
    out = torch.empty(out_shape, dtype=q.dtype, device="meta")  # the kernel's out: contiguous
    empty_rows, segments = plan_segments(qo_len, k.shape[0], causal, window_left)
    k4, v4 = bhsd(k), bhsd(v)
    steps = []
    for seg in segments:
        q4, o4 = bhsd(q[seg.start:seg.stop]), bhsd(out[seg.start:seg.stop])
        spec = GraphSpec.make(q4, k4, v4, o4, seg, stats=stats, sm_scale=sm_scale)
        steps.append(Step(spec, seg.start, seg.stop, view_of(q4, q), view_of(o4, out),
                          tuple(spec.stats_dims()) if stats else None))
    return CallPlan(empty_rows, out_shape, view_of(k4, k), view_of(v4, v), tuple(steps))


def call_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              window_left: int, stats: bool, sm_scale: float) -> tuple:
    """The cache key of :func:`plan_call` for these arguments: everything it depends on."""
    return (q.device, q.dtype, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
            causal, window_left, stats, sm_scale)


def needs_copy(t: torch.Tensor) -> bool:
    """Whether ``t`` (fp16/bf16 ``[S, H, D]``) breaks cuDNN's operand rules: unit innermost stride,
    16-byte aligned base, positive 16-byte multiple strides on the other dims of size > 1. Such an
    operand is copied."""
    if t.stride(-1) != 1 or t.data_ptr() % 16:
        return True
    step = 16 // t.element_size()
    return any(n > 1 and (s <= 0 or s % step) for n, s in zip(t.shape[:-1], t.stride()[:-1]))


class GraphCache:
    """A thread-safe LRU map from a hashable key to a built graph, with hit/miss counters.

    Builds are serialised by one lock (a build takes ~0.1-1 s and two threads asking for the same
    key must not build it twice); lookups of existing keys never wait on a build.
    """

    def __init__(self, maxsize: int = 256):
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def get(self, key: Hashable, build: Callable[[], object]) -> object:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry
        with self._build_lock:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:  # another thread built it meanwhile
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return entry
            entry = build()
            with self._lock:
                self.misses += 1
                self._entries[key] = entry
                while len(self._entries) > self.maxsize:
                    self._entries.popitem(last=False)
                    self.evictions += 1
            return entry

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def info(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "size": len(self._entries), "maxsize": self.maxsize}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = self.evictions = 0
