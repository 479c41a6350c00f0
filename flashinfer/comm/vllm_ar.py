"""Upstream's port of vLLM's custom all-reduce (``flashinfer.comm.vllm_ar``; exported as
``vllm_init_custom_ar``, ``vllm_all_reduce``, ...), with upstream's signatures, on the fused
all-reduce of :mod:`.fusion` (op ``allreduce_fusion``, pattern ``kAllReduce``).

What differs: vLLM's kernel reads the peers' buffers through CUDA IPC (the pointers given to
``init_custom_ar`` / ``register_buffer``, the graph buffers exchanged through
``get_graph_buffer_ipc_meta`` / ``register_graph_buffers``). Here the sum is
``torch.distributed``'s ``all_reduce`` over the process group the handle records (the world
unless ``init_custom_ar(..., group=...)`` names one), taken in fp32 and rounded once. So the
pointers are checked for count and kept, never dereferenced; every tensor may be reduced
(there is no "registered buffer" requirement, and no graph buffers to share); ``num_ctas``
changes nothing. Upstream's kernel limits (even world size up to 8) do not apply.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import List, Tuple

import torch

from ..api_logging import flashinfer_api
from .fusion import AllReduceFusionPattern, resolve_group, run_fused

#: upstream's ``meta_size()`` is the size of vLLM's per-rank signal block: a self counter and
#: two peer counters, each ``[kMaxBlocks=36][8]`` uint32 (128-byte aligned rows)
_MAX_BLOCKS = 36
META_SIZE = 3 * _MAX_BLOCKS * 8 * 4


@dataclass
class _CustomAllReduce:
    group: object
    rank: int
    world_size: int
    full_nvlink: bool
    registered: list = field(default_factory=list)  # the pointer lists register_buffer got


_HANDLES: dict[int, _CustomAllReduce] = {}
_NEXT = itertools.count(1)  # (handles are never 0, like the pointers upstream hands out)


def _handle(fa) -> _CustomAllReduce:
    state = _HANDLES.get(fa) if isinstance(fa, int) and not isinstance(fa, bool) else None
    if state is None:
        raise ValueError(f"fa must be a live handle from vllm_init_custom_ar, got {fa!r}")
    return state


def _pointer_list(name: str, ptrs, world_size: int) -> list:
    if not isinstance(ptrs, (list, tuple)) or len(ptrs) != world_size \
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in ptrs):
        raise ValueError(f"{name} must be a list of {world_size} ints (one per rank), got "
                         f"{ptrs!r}")
    return list(ptrs)


@flashinfer_api
def init_custom_ar(ipc_tensors: List[int], rank_data: torch.Tensor, rank: int,
                   full_nvlink: bool, *, group=None) -> int:
    """A custom all-reduce handle for this ``rank`` of ``len(ipc_tensors)`` ranks.

    ``ipc_tensors``: one int per rank (upstream: the peers' IPC buffer pointers; checked for
    count, not used); ``rank_data``: upstream's scratch tensor (checked to be a tensor);
    ``full_nvlink``: recorded. ``group`` (keyword, ours): the process group to reduce over,
    default the world; its size and this rank must match. Returns an int handle (``fa``)."""
    if not isinstance(rank_data, torch.Tensor):
        raise TypeError(f"rank_data must be a torch.Tensor, got {type(rank_data).__name__}")
    if not isinstance(ipc_tensors, (list, tuple)) or not ipc_tensors:
        raise ValueError(f"ipc_tensors must be a list of one int per rank, got {ipc_tensors!r}")
    world_size = len(_pointer_list("ipc_tensors", ipc_tensors, len(ipc_tensors)))
    group = resolve_group(group, world_size, rank, "vllm_init_custom_ar")
    fa = next(_NEXT)
    _HANDLES[fa] = _CustomAllReduce(group, rank, world_size, bool(full_nvlink))
    return fa


@flashinfer_api
def dispose(fa: int) -> None:
    """Release handle ``fa``; using it afterwards raises."""
    _handle(fa)
    del _HANDLES[fa]


@flashinfer_api
def all_reduce(fa: int, inp: torch.Tensor, out: torch.Tensor, reg_buffer: int,
               reg_buffer_sz_bytes: int, num_ctas: int) -> None:
    """``out <- sum of inp`` over the handle's group: ``inp`` and ``out`` float32 / float16 /
    bfloat16 of one dtype and size (any shapes), ``out`` contiguous. As upstream, a nonzero
    ``reg_buffer`` must hold the input (``reg_buffer_sz_bytes >= inp`` bytes); it is not
    read here. ``num_ctas`` (a positive int) does not change the result."""
    state = _handle(fa)
    for name, t in (("inp", inp), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if out.dtype != inp.dtype or out.numel() != inp.numel() or inp.numel() == 0:
        raise ValueError(f"inp and out must be non-empty, of one dtype and size; got {inp.dtype} "
                         f"{list(inp.shape)} and {out.dtype} {list(out.shape)}")
    for name, value in (("reg_buffer", reg_buffer), ("reg_buffer_sz_bytes", reg_buffer_sz_bytes),
                        ("num_ctas", num_ctas)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if num_ctas < 1:
        raise ValueError(f"num_ctas must be >= 1, got {num_ctas}")
    size = inp.numel() * inp.element_size()
    if reg_buffer != 0 and size > reg_buffer_sz_bytes:
        raise ValueError(f"the registered buffer ({reg_buffer_sz_bytes} bytes) cannot hold inp "
                         f"({size} bytes)")
    if not out.is_contiguous():
        raise ValueError(f"out must be contiguous, got strides {out.stride()}")
    rows = inp.reshape(-1, inp.shape[-1] if inp.dim() else 1)
    run_fused(AllReduceFusionPattern.kAllReduce, rows, state.group, state.world_size,
              output=out.view(rows.shape))


@flashinfer_api
def get_graph_buffer_ipc_meta(fa: int) -> Tuple[List[int], List[int]]:
    """``(handle bytes, offsets)`` of the buffers a CUDA graph captured: both empty here (no
    IPC buffers to share; every tensor may be reduced)."""
    _handle(fa)
    return [], []


@flashinfer_api
def register_buffer(fa: int, fake_ipc_ptrs: List[int]) -> None:
    """Record the peers' buffer pointers (one int per rank; checked, kept, not used)."""
    state = _handle(fa)
    state.registered.append(_pointer_list("fake_ipc_ptrs", fake_ipc_ptrs, state.world_size))


@flashinfer_api
def register_graph_buffers(fa: int, handles: List[List[int]], offsets: List[List[int]]) -> None:
    """Accept every rank's :func:`get_graph_buffer_ipc_meta` (one list per rank each; checked
    for count, nothing to open here)."""
    state = _handle(fa)
    for name, value in (("handles", handles), ("offsets", offsets)):
        if not isinstance(value, (list, tuple)) or len(value) != state.world_size \
                or not all(isinstance(v, (list, tuple)) for v in value):
            raise ValueError(f"{name} must be a list of {state.world_size} lists (one per rank), "
                             f"got {value!r}")


def meta_size() -> int:
    """Bytes of vLLM's per-rank signal block (upstream's value; a caller sizes its buffers)."""
    return META_SIZE


__all__ = ["META_SIZE", "all_reduce", "dispose", "get_graph_buffer_ipc_meta", "init_custom_ar",
           "meta_size", "register_buffer", "register_graph_buffers"]
