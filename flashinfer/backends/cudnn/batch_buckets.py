"""Pure-Python planning for the cuDNN batch attention planners: buckets, graph keys, metadata.

Nothing here imports ``cudnn`` or touches a GPU, so all of it is unit-tested on CPU.

Bucketed graphs
---------------
cuDNN graphs are built for static shapes (see :mod:`._graphs`) and a build costs 0.5-1 s, so a
graph must not depend on the batch composition. A :class:`BatchSpec` (the graph-cache key) holds
only *buckets*: the batch size and, per request, the longest query run and the number of pages
(or KV rows) are rounded up to powers of two. The real lengths travel in device tensors that
the planner fills, padded to the bucket (:func:`build_metadata` states the contents; dense
decode sends the same through :func:`decode_arrays` in the plan's own upload):

* ``seq_len_q`` / ``seq_len_kv`` ``[Bb, 1, 1, 1]`` int32 (cuDNN padding mask);
* ``page_table`` ``[Bb, 1, Pb, 1]`` int32 (paged ops): request ``b``'s pages, then the batch's
  first page id as padding (a valid page, never read: it lies past ``seq_len_kv``), gathered on
  the device from ``kv_indices`` by one ``index_select`` (:func:`fill_page_table`) through the
  host-made positions ``page_src`` — dense decode with the page ids on the host gathers rows of
  the uploaded ids instead (:func:`gather_decode_table`), with the pages that follow as padding;
* ragged offsets ``[Bb + 1, 1, 1, 1]`` int32, in elements, for ragged Q/O (prefill) and K/V
  (ragged op): ``indptr * heads * head_dim``.

Padded requests ``b >= batch_size`` run nothing useful: in prefill they get ``seq_len_q = 0``
and offsets at the end of the buffers; in decode (a dense ``[Bb, H, 1, D]`` query) they run one
row into scratch rows the runner owns. Every KV length handed to cuDNN is at least 1 and every
page id or KV offset it may read is valid (page 0, row 0): a request with no key runs on one key
and its rows are then cleared (output 0, lse ``-inf``, the batch contract). Those rows — and,
under a causal mask, query rows with no key before them (``qo_len > kv_len``) — are listed in
``dead_rows``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from ...shape_buckets import length_bucket

DECODE, PAGED, RAGGED = "batch_decode", "batch_prefill_paged", "batch_prefill_ragged"


@dataclass(frozen=True)
class BatchSpec:
    """Everything one batch SDPA graph depends on except the KV operands' geometry (known only
    at run, see :meth:`kv_key`); hashable, part of the graph-cache key."""

    op: str
    device_index: int
    dtype: str  # "float16" | "bfloat16" (q, kv and o)
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: int
    page_size: int  # 0 for the ragged op
    batch_bucket: int  # Bb
    qo_bucket: int  # rows per request declared for Q/O (1 for a dense decode query)
    kv_bucket: int  # pages per request (paged) or KV rows per request (ragged)
    ragged_q: bool  # Q/O addressed through ragged offsets (prefill, multi-query decode)
    causal: bool
    left_bound: int | None  # cuDNN diagonal_band_left_bound (window_left + 1), None = no window
    stats: bool
    sm_scale: float  # the softmax scale baked into the graph (sm_scale * q_scale * k_scale)

    @property
    def max_kv_len(self) -> int:
        """The KV length the graph is declared with (``paged_attention_max_seq_len_kv``)."""
        return self.kv_bucket * self.page_size if self.page_size else self.kv_bucket

    def q_dims(self) -> list[int]:
        return [self.batch_bucket, self.num_qo_heads, self.qo_bucket, self.head_dim_qk]

    def o_dims(self) -> list[int]:
        return [self.batch_bucket, self.num_qo_heads, self.qo_bucket, self.head_dim_vo]

    def q_stride(self) -> list[int]:
        """Row-major ``[T, H, D]`` rows seen as ``[Bb, H, S, D]`` (BHSD)."""
        h, s, d = self.num_qo_heads, self.qo_bucket, self.head_dim_qk
        return [s * h * d, d, h * d, 1]

    def o_stride(self) -> list[int]:
        h, s, d = self.num_qo_heads, self.qo_bucket, self.head_dim_vo
        return [s * h * d, d, h * d, 1]

    def stats_dims(self) -> list[int]:
        return [self.batch_bucket, self.num_qo_heads, self.qo_bucket, 1]

    def stats_stride(self) -> list[int]:
        h, s = self.num_qo_heads, self.qo_bucket
        return [h * s, s, 1, 1]

    def ragged_kv_dims(self, head_dim: int) -> list[int]:
        return [self.batch_bucket, self.num_kv_heads, self.kv_bucket, head_dim]

    def ragged_kv_stride(self, head_dim: int) -> list[int]:
        h, s = self.num_kv_heads, self.kv_bucket
        return [s * h * head_dim, head_dim, h * head_dim, 1]

    def table_dims(self) -> list[int]:
        return [self.batch_bucket, 1, self.kv_bucket, 1]

    def describe(self) -> str:
        band = ("causal" if self.causal else "no causal") + (
            f", left bound {self.left_bound}" if self.left_bound is not None else "")
        kv = (f"{self.kv_bucket} pages x {self.page_size}" if self.page_size
              else f"{self.kv_bucket} rows")
        return (f"{self.op} {self.dtype} Bb={self.batch_bucket} q[{self.num_qo_heads}h x "
                f"{self.qo_bucket} x {self.head_dim_qk}] kv[{self.num_kv_heads}h, {kv}, "
                f"d {self.head_dim_qk}/{self.head_dim_vo}] {band}, stats={self.stats}, "
                f"scale={self.sm_scale:g}, cuda:{self.device_index}")


def container(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A paged cache view ``[P, page, H, D]`` (NHD) or ``[P, H, page, D]`` (HND) as cuDNN's page
    container ``[P, H, page, D]`` (a view; NHD differs only in its strides)."""
    return t.permute(0, 2, 1, 3) if layout == "NHD" else t


def kv_key(k: torch.Tensor, v: torch.Tensor) -> tuple:
    """The part of a graph's key that only the run's K/V operands fix: shapes and strides (paged:
    the page containers, so the pool size; ragged: the row tensors)."""
    return (tuple(k.shape), tuple(k.stride()), tuple(v.shape), tuple(v.stride()))


def make_spec(plan, *, device_index: int, scale: float, min_kv: int = 1) -> BatchSpec:
    """The bucketed graph key of a :class:`~flashinfer.attention.batch_params.BatchPlan`;
    ``min_kv`` raises the pages (rows) per request the graph is declared for."""
    b = plan.batch_size
    ragged_q = plan.op != DECODE or plan.q_len_per_req > 1
    max_qo = plan.max_qo_len if b else 1
    # pages per request: with last_page_len in [1, page_size] (checked in plan()) a request of
    # n keys has exactly ceil(n / page_size) pages
    kv_need = plan.max_kv_len if plan.op == RAGGED else -(-plan.max_kv_len // plan.page_size)
    single_row = not ragged_q
    window = plan.window_left >= 0
    return _spec(
        plan.op, device_index, plan.q_dtype, plan.num_qo_heads, plan.num_kv_heads,
        plan.head_dim_qk, plan.head_dim_vo, plan.page_size if plan.op != RAGGED else 0,
        length_bucket(max(b, 1)), 1 if single_row else length_bucket(max(max_qo, 1)),
        length_bucket(max(kv_need, min_kv, 1)), ragged_q,
        # one query row per request: causal hides nothing; with a window the causal-like band is
        # the form every cuDNN version with windows supports (as in single decode)
        (plan.causal and not single_row) or (single_row and window),
        plan.window_left + 1 if window else None, float(scale))


@functools.lru_cache(maxsize=1024)
def _spec(op, device_index, q_dtype, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
          page_size, batch_bucket, qo_bucket, kv_bucket, ragged_q, causal, left_bound,
          sm_scale) -> BatchSpec:
    """:class:`BatchSpec` by value, cached: a serving loop plans the same buckets every step."""
    return BatchSpec(op=op, device_index=device_index,
                     dtype=str(q_dtype).removeprefix("torch."), num_qo_heads=num_qo_heads,
                     num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk, head_dim_vo=head_dim_vo,
                     page_size=page_size, batch_bucket=batch_bucket, qo_bucket=qo_bucket,
                     kv_bucket=kv_bucket, ragged_q=ragged_q, causal=causal,
                     left_bound=left_bound, stats=True, sm_scale=sm_scale)


def fits(spec: BatchSpec, plan) -> bool:
    """Whether ``plan``'s batch fits the buckets of ``spec`` (a CUDA-graph plan keeps its graph
    and buffers as long as it does)."""
    grown = make_spec(plan, device_index=spec.device_index, scale=spec.sm_scale)
    return (grown.batch_bucket <= spec.batch_bucket and grown.qo_bucket <= spec.qo_bucket
            and grown.kv_bucket <= spec.kv_bucket)


_FIELDS = ("seq_len_q", "seq_len_kv", "page_src", "q_offsets", "o_offsets", "k_offsets",
           "v_offsets", "stats_b", "stats_pos", "dead_rows")


@dataclass(frozen=True)
class Metadata:
    """The host (CPU) metadata of one plan, packed for one upload: ``flat`` (uint8) laid out by
    ``layout`` (:func:`metadata_layout`). Its pieces, as typed views (None when the graph does
    not read it), by attribute — only the tests and the probe look at them:

    * ``seq_len_q``, ``seq_len_kv`` ``[Bb, 1, 1, 1]`` int32;
    * ``page_src`` ``[Bb * Pb]`` int32 (paged ops): positions in ``kv_indices``;
    * ``q_offsets``, ``o_offsets`` (ragged Q), ``k_offsets``, ``v_offsets`` (ragged op)
      ``[Bb + 1, 1, 1, 1]`` int32, in elements;
    * ``stats_b``, ``stats_pos`` ``[Bb * S]`` int64 (ragged Q): token t's request and its row;
    * ``dead_rows`` ``[Bb * S]`` bool: token t sees no key (output 0, lse -inf).
    """

    flat: torch.Tensor  # [bytes] uint8
    layout: dict
    num_dead: int

    def __getattr__(self, name: str):
        if name not in _FIELDS:
            raise AttributeError(name)
        return unpack(self.flat, {name: self.layout[name]})[name] if name in self.layout else None


@functools.lru_cache(maxsize=256)
def metadata_layout(spec: BatchSpec) -> tuple[dict, int]:
    """Byte layout of the metadata pieces ``spec``'s graph reads (see :func:`byte_layout`).
    A dense decode query (one row per request) needs no per-token stats map."""
    bb, col = spec.batch_bucket, (spec.batch_bucket, 1, 1, 1)
    edges = (bb + 1, 1, 1, 1)
    pieces = {"seq_len_q": (torch.int32, col), "seq_len_kv": (torch.int32, col)}
    if spec.page_size:
        pieces["page_src"] = (torch.int32, (bb * spec.kv_bucket,))
    else:
        pieces["k_offsets"] = pieces["v_offsets"] = (torch.int32, edges)
    capacity = bb * spec.qo_bucket
    if spec.ragged_q:
        pieces["q_offsets"] = pieces["o_offsets"] = (torch.int32, edges)
        pieces["stats_b"] = pieces["stats_pos"] = (torch.int64, (capacity,))
    pieces["dead_rows"] = (torch.bool, (capacity,))
    return byte_layout(pieces)


_NP = {torch.int32: np.int32, torch.int64: np.int64, torch.bool: np.bool_}


@functools.lru_cache(maxsize=64)
def _arange(n: int) -> np.ndarray:
    a = np.arange(n, dtype=np.int32)
    a.flags.writeable = False  # shared between plans
    return a


def build_metadata(spec: BatchSpec, plan) -> Metadata:
    """The padded per-request metadata of ``plan`` for the buckets of ``spec``, written straight
    into one packed host buffer (numpy views; a batch of 64 costs a few tens of microseconds)."""
    layout, size = metadata_layout(spec)
    flat = np.zeros(size, dtype=np.uint8)
    views = {}
    for name, (offset, dtype, shape) in layout.items():
        n = math.prod(shape)
        views[name] = flat[offset:offset + n * dtype.itemsize].view(_NP[dtype])
    b, bb = plan.batch_size, spec.batch_bucket
    qo_indptr = plan.qo_indptr_host.numpy()
    kv_lens = plan.kv_lens_host.numpy()
    kv_indptr = plan.kv_indptr_host.numpy()

    seq_q, seq_kv = views["seq_len_q"], views["seq_len_kv"]
    if spec.ragged_q:
        seq_q[:b] = qo_indptr[1:] - qo_indptr[:-1]  # padded requests: 0 rows
    else:
        seq_q[:] = 1
    seq_kv[:] = 1  # a request with no key (and a padded one) runs on one, then is cleared
    np.maximum(kv_lens, 1, out=seq_kv[:b])

    if spec.page_size and b:
        page_positions(kv_indptr, views["page_src"].reshape(bb, spec.kv_bucket)[:b])
    else:
        # every request reads at least one row: an empty or padded one reads row 0 (valid)
        starts = np.where(kv_lens == 0, 0, kv_indptr[:-1])
        views["k_offsets"][:b] = starts * (spec.num_kv_heads * spec.head_dim_qk)
        views["v_offsets"][:b] = starts * (spec.num_kv_heads * spec.head_dim_vo)

    dead = views["dead_rows"]
    if spec.ragged_q:
        total = int(qo_indptr[-1])
        qo_lens = qo_indptr[1:] - qo_indptr[:-1]
        for name, row in (("q_offsets", spec.num_qo_heads * spec.head_dim_qk),
                          ("o_offsets", spec.num_qo_heads * spec.head_dim_vo)):
            views[name][:b + 1] = qo_indptr * row
            views[name][b + 1:] = total * row  # padded requests start at the end
        # per token: its request and its row in the request
        views["stats_b"][:total] = np.repeat(np.arange(b), qo_lens)
        views["stats_pos"][:total] = np.arange(total) - np.repeat(qo_indptr[:-1], qo_lens)
        # rows that see no key: all of a request without keys; under a causal mask the first
        # qo_len - kv_len rows of a request with more queries than keys
        blind = np.where(kv_lens == 0, qo_lens,
                         np.clip(qo_lens - kv_lens, 0, None) if plan.causal else 0)
        for r in np.flatnonzero(blind):
            dead[qo_indptr[r]:qo_indptr[r] + blind[r]] = True
    else:
        dead[:b] = kv_lens == 0

    return Metadata(torch.from_numpy(flat), layout, int(dead.sum()))


def page_positions(kv_indptr: np.ndarray, out: np.ndarray) -> None:
    """``out [b, Pb]`` ← request ``r``'s page positions in ``kv_indices``: ``kv_indptr[r] + j``,
    then (padding, never read: past ``seq_len_kv``) the positions that follow, clipped to the
    last listed page, so that every entry names a valid page."""
    pb = out.shape[1]
    np.add(kv_indptr[:-1, None], _arange(pb), out=out)
    # only the trailing requests, whose row runs past the last page, need the clip
    last_page = max(int(kv_indptr[-1]) - 1, 0)
    first = int(np.searchsorted(kv_indptr[:-1], last_page - pb + 1, side="right"))
    if first < out.shape[0]:
        np.minimum(out[first:], last_page, out=out[first:])


def decode_arrays(spec: BatchSpec, plan) -> dict:
    """Dense decode (one query row per request): what its graph reads that changes with every
    plan, made on the host for the plan's upload (1-D int32 arrays):

    * ``seq_len_kv`` ``[Bb]``: ``max(kv_len, 1)``, 1 for padded requests;
    * ``row_starts`` ``[Bb]``: each request's first position in ``kv_indices`` (0 for padded
      requests).

    The page table is then the plan's page ids followed by ``Pb`` zeros
    (``Prepared.kv_indices_tail``: uploaded with the ids), seen as overlapping windows of ``Pb``
    and gathered at ``row_starts`` (:func:`gather_decode_table`: one gather on the device, no
    per-entry host work). Request ``r``'s row is its pages, as in :func:`build_metadata` (the
    tests hold them together), then (never read: past ``seq_len_kv``) the pages that follow it
    in ``kv_indices`` and zeros: page 0, valid in any cache that has pages; a padded request's
    row holds valid ids too."""
    b, bb = plan.batch_size, spec.batch_bucket
    seq_kv = np.ones(bb, dtype=np.int32)  # no key, or padded: runs on one key, then is cleared
    np.maximum(plan.kv_lens_host.numpy(), 1, out=seq_kv[:b])
    starts = np.zeros(bb, dtype=np.int32)
    starts[:b] = plan.kv_indptr_host.numpy()[:-1]
    return {"seq_len_kv": seq_kv, "row_starts": starts}


def gather_decode_table(table: torch.Tensor, ids_padded: torch.Tensor,
                        row_starts: torch.Tensor) -> None:
    """``table [Bb, 1, Pb, 1]`` ← row ``r`` = ``ids_padded[row_starts[r] : row_starts[r] + Pb]``,
    ``ids_padded`` being the page ids, then at least ``Pb`` zeros: one
    ``index_select`` over the overlapping windows (see :func:`decode_arrays`)."""
    pb = table.shape[2]
    torch.index_select(ids_padded.unfold(0, pb, 1), 0, row_starts, out=table.view(-1, pb))


def fill_page_table(table: torch.Tensor, page_src: torch.Tensor, kv_indices: torch.Tensor) -> None:
    """``table [Bb, 1, Pb, 1]`` int32 ← ``kv_indices[page_src]`` (one ``index_select``; zeros
    when the batch has no page). Device work only (no host sync): run in the planner."""
    flat = table.view(-1)
    if kv_indices.numel() == 0:
        flat.zero_()
        return
    torch.index_select(kv_indices, 0, page_src, out=flat)


#: byte alignment of every piece of a packed buffer (256: what cuDNN wants of its operands)
ALIGN_BYTES = 256


def byte_layout(pieces: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                start: int = 0) -> tuple[dict[str, tuple[int, torch.dtype, tuple[int, ...]]], int]:
    """``{name: (byte offset, dtype, shape)}`` for pieces laid out from ``start``, each
    :data:`ALIGN_BYTES`-aligned, and the end offset."""
    layout, offset = {}, start
    for name, (dtype, shape) in pieces.items():
        offset = -(-offset // ALIGN_BYTES) * ALIGN_BYTES
        layout[name] = (offset, dtype, tuple(shape))
        n = 1
        for extent in shape:
            n *= extent
        offset += n * dtype.itemsize
    return layout, offset


def unpack(flat: torch.Tensor, layout: dict) -> dict[str, torch.Tensor]:
    """The per-name views of a uint8 buffer laid out by :func:`byte_layout` (or its device
    copy)."""
    views = {}
    for name, (offset, dtype, shape) in layout.items():
        n = 1
        for extent in shape:
            n *= extent
        size = n * dtype.itemsize
        views[name] = flat[offset:offset + size].view(dtype).view(shape)
    return views
