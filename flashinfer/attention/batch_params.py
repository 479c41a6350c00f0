"""The contract between the batch attention wrappers and the backends: plan once, run many.

Ops (op_catalog): ``batch_decode`` (paged KV, ``q_len_per_req`` queries per request),
``batch_prefill_paged`` (ragged queries, paged KV) and ``batch_prefill_ragged`` (ragged queries,
ragged K/V). The wrappers (``BatchDecodeWithPagedKVCacheWrapper``, ...) validate the user's
arguments in ``plan()``, build a :class:`BatchPlan`, make the Decision, and ask the chosen
backend for a runner::

    runner = decision.kernel(plan)          # host work: splits, graph builds, metadata copies
    runner(q, kv, out, lse, scales)         # every run(): no host sync, no data-dependent
                                            # allocation, no decision; capturable in a CUDA
                                            # graph when plan.cuda_graph is True

A backend registers one *planner* per op: ``@KERNELS.kernel("batch_decode")`` taking a
:class:`BatchPlan` and returning a :class:`Runner`. Anything a planner allocates (split-K
scratch, cuDNN workspace) is allocated in the planner, or carved from ``plan.workspace``.

A planner that needs its own host-made arrays on the device (cuDNN's page table) may also
offer ``planner.prepare(plan) -> Prepared``. The wrapper then calls it *before* the plan's index
arrays are uploaded — the plan's device fields are still ``None`` there (a CUDA-graph wrapper's
fixed buffers excepted) — sends ``Prepared.uploads`` in the same host-to-device copy as the index
arrays, and calls ``Prepared.finish(device_views)`` for the runner. Calling the planner itself
must still work on a complete plan (it then uploads on its own).

Runner call (all tensors on ``plan.device``):

* ``q``: ``[total_qo, num_qo_heads, head_dim_qk]`` (decode: ``total_qo = batch * q_len_per_req``)
* ``kv``: :class:`KVInput` — paged ops: ``k_cache``/``v_cache`` as ``[pages, page_size, H_kv, D]``
  (NHD) or ``[pages, H_kv, page_size, D]`` (HND) views (a 5-D cache arrives split, no copy);
  ragged op: ``k [total_kv, H_kv, D_qk]`` and ``v [total_kv, H_kv, D_vo]`` (NHD views; HND input
  arrives transposed)
* ``out``: ``[total_qo, num_qo_heads, head_dim_vo]`` in ``plan.o_dtype``, to be fully written;
  a runner whose ``makes_output`` attribute is True also takes ``None`` (only when
  ``plan.o_dtype`` is q's dtype) and returns the contiguous output its kernel allocated (FA2 /
  FA3 allocate it in C++, cheaper than a Python-side ``torch.empty`` on the hot path)
* ``lse``: ``[total_qo, num_qo_heads]`` float32 base 2, or ``None`` when not requested
* ``scales``: :class:`RunScales` (floats, already validated)

Semantics are those of the single-request ops (attention/params.py) applied per request ``b``:
its queries ``q[qo_indptr[b]:qo_indptr[b+1]]`` attend to its ``kv_lens[b]`` keys, read for paged
ops from pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (the last page holding
``kv_last_page_len[b]`` entries) and for ragged ops from rows ``kv_indptr[b]:kv_indptr[b+1]``.
Causal masks are bottom-right aligned per request; ``window_left`` as in single prefill;
``logits_soft_cap`` caps ``sm_scale * q.k``; FP8 KV is dequantised as ``k * k_scale``,
``v * v_scale`` (``k_scale`` multiplies into the softmax scale, ``v_scale`` into the output);
``q_scale`` multiplies into the softmax scale; ``sinks[h]`` adds ``exp(sink_h - m)`` to the
softmax denominator of head ``h`` (natural-log logit, not added to the lse); a custom mask
(prefill) is the flattened per-request ``qo_len x kv_len`` boolean blocks, True = keep, and
replaces causal. A query row that sees no key gets output 0 and lse -inf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import torch


@dataclass(frozen=True, eq=False)
class BatchPlan:
    """Everything ``plan()`` fixed. Host arrays are CPU int32 tensors; device arrays are the
    same values on ``device`` (for a CUDA-graph wrapper, its fixed buffers)."""

    op: str  # "batch_decode" | "batch_prefill_paged" | "batch_prefill_ragged"
    device: torch.device
    batch_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: int
    page_size: int  # 0 for the ragged op
    kv_layout: str  # "NHD" | "HND"
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    o_dtype: torch.dtype
    causal: bool
    window_left: int  # -1: unlimited
    logits_soft_cap: float  # 0: off
    sm_scale: float  # before q_scale / k_scale
    q_len_per_req: int  # decode only (1 for plain decode); 0 for prefill
    # host copies (CPU int32)
    qo_indptr_host: torch.Tensor  # [B+1]
    kv_indptr_host: torch.Tensor  # [B+1] (paged: page indptr; ragged: row indptr)
    kv_lens_host: torch.Tensor  # [B]
    kv_last_page_len_host: torch.Tensor | None  # [B], paged only
    # device copies (int32 on ``device``)
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor | None  # [kv_indptr[-1]] page ids, paged only
    kv_lens: torch.Tensor
    kv_last_page_len: torch.Tensor | None
    total_qo: int
    max_qo_len: int
    max_kv_len: int
    kv_indices_host: torch.Tensor | None = None  # the page ids when given on the host, else None
    custom_mask: torch.Tensor | None = None  # flattened bool on device, prefill only
    mask_indptr_host: torch.Tensor | None = None  # [B+1] offsets into custom_mask
    cuda_graph: bool = False
    workspace: torch.Tensor | None = None  # the float workspace buffer as 1-D uint8 bytes
    # the wrapper's scratch dict, the same object every plan(): a planner may keep device buffers
    # here and rewrite them in the next plan() instead of allocating (runs of an older plan of
    # the same wrapper are never issued after a new plan()). None: nothing is kept.
    reusable: dict | None = None
    # positional encoding applied inside the attention: "NONE" | "ROPE_LLAMA" | "ALIBI"
    # (query row r of a request at position kv_len - qo_len + r, key j at j)
    pos_encoding_mode: str = "NONE"
    rope_scale: float = 1.0
    rope_theta: float = 1e4


@dataclass(frozen=True)
class RunScales:
    q_scale: float = 1.0
    k_scale: float = 1.0
    v_scale: float = 1.0
    sinks: torch.Tensor | None = None  # [num_qo_heads] float32 on the plan's device


class KVInput(NamedTuple):
    """Paged ops: ``k_cache``/``v_cache`` page views; ragged op: ``k``/``v`` row tensors (a
    named tuple: made on every run()). ``derived``: paged ops, a dict that stays with this
    cache (the same object on every run() given the same cache tensors in the same layout,
    :class:`~flashinfer.attention.batch_checks.PagedCacheViews`), where a runner may keep what
    it derives from ``k`` and ``v`` alone; None otherwise."""

    k: torch.Tensor
    v: torch.Tensor
    derived: dict | None = None


def bind_device_arrays(plan: BatchPlan, views: dict[str, torch.Tensor]) -> None:
    """Set the device fields of a plan built before its upload (``qo_indptr``, ``kv_indptr``,
    ``kv_lens`` and, paged, ``kv_last_page_len`` / ``kv_indices``): the one mutation of a plan,
    made by the wrapper before any runner sees the plan complete."""
    for name, view in views.items():
        object.__setattr__(plan, name, view)


@dataclass(frozen=True, eq=False)
class Prepared:
    """A two-phase planner's host part: ``uploads`` ``{name: (array, fixed)}`` — a 1-D int32
    host array (numpy or CPU tensor) and the device buffer it must land in (None: anywhere) —
    and ``finish(views)``, which gets ``{name: device tensor}`` once they are queued and
    returns the :class:`Runner`.

    ``kv_indices_tail > 0`` asks for the plan's page ids followed by that many zeros (page 0:
    valid in any cache that has pages), as ``views["kv_indices_padded"]``: the wrapper uploads
    the ids once, with the tail, and ``plan.kv_indices`` is the head of the same buffer (a
    CUDA-graph wrapper's fixed id buffer gets a separate padded copy)."""

    uploads: dict
    finish: object  # Callable[[dict[str, torch.Tensor]], Runner]
    kv_indices_tail: int = 0


class Runner(Protocol):
    """Writes ``out`` (returns nothing, or ``out``); one with ``makes_output = True`` also
    takes ``out=None`` and returns the output it made (see the module note)."""

    def __call__(self, q: torch.Tensor, kv: KVInput, out: torch.Tensor | None,
                 lse: torch.Tensor | None, scales: RunScales) -> torch.Tensor | None: ...


class Tail(NamedTuple):
    """An array followed by ``count`` zeros, uploaded as one array without first being copied
    into a longer one. ``array``: on the host or on the device (the zeros are written in the
    pinned buffer either way). The cuDNN decode page table pads with it: page 0, a valid page
    of any cache that has pages, in entries no kernel reads."""

    array: "np.ndarray | torch.Tensor"
    count: int

    def joined(self) -> "np.ndarray | torch.Tensor":
        n = self.array.shape[0]
        if isinstance(self.array, torch.Tensor):
            return torch.cat((self.array, self.array.new_zeros(self.count)))
        out = np.zeros(n + self.count, dtype=self.array.dtype)
        out[:n] = self.array
        return out
