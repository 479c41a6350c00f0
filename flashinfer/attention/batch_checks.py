"""The checks of the batch wrappers' plan() and run(): index arrays, dtypes, fixed buffers,
workspace, run-time scales; what a BatchPlan is built from.

Validation happens in ``plan()`` on *host* copies (CPU int32): dtype int32, rank 1, lengths,
``indptr[0] == 0`` and monotone, ``last_page_len`` in ``[1, page_size]`` (``[0, page_size]`` for a
request with no page), page indices ``>= 0``. An index array given on the host is used as is (no
device-to-host copy); all of a plan's host arrays reach the device in one non-blocking copy
(:mod:`flashinfer.attention.upload`). An indptr / last_page_len given on the device is copied to the
host once (a synchronisation, as upstream does for ``indptr``) so that it can be checked; page
ids kept on the device reach the plan's device buffer through the upload's pinned buffer (a
device-to-host copy, then the plan's one host-to-device copy: see :mod:`flashinfer.attention.upload`),
and plan() checks that host copy at its end (:class:`DeviceIdsCheck`), so the GPU round trip
overlaps the host work in between — still a wait for the work already queued before plan();
``FLASHINFER_TRUST_DEVICE_PAGE_IDS=1`` skips the wait and the check, as upstream does. Page
indices are checked against the *cache size* in ``run()``: plan() does not see the cache, so it keeps
the largest index (a Python int) and every run() compares it with ``k_cache.shape[0]`` — an int
comparison, no device work.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from .. import envs
from .batch_params import BatchPlan, KVInput
from .page import unpack_paged_kv_cache

if TYPE_CHECKING:  # (for an annotation only)
    from .upload import PlanUpload

Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
KV_DTYPES = Q_DTYPES + FP8_DTYPES


def canonical_dtype(name: str, value, default, allowed) -> torch.dtype:
    """``torch.dtype`` or its string spelling (``"bfloat16"``, ``"torch.float16"``)."""
    if value is None:
        value = default
    if isinstance(value, str):
        value = getattr(torch, value.removeprefix("torch."), value)
    if not isinstance(value, torch.dtype) or value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed: "
                         f"{', '.join(str(d).removeprefix('torch.') for d in allowed)}")
    return value


def plan_dtypes(q_data_type, kv_data_type, o_data_type) -> tuple:
    """``(q_dtype, kv_dtype, o_dtype, fp8_q)`` of a plan. An fp8 ``q_data_type`` needs a 16-bit
    ``o_data_type``; the plan then runs on q widened to it (exactly: run() casts an fp8 q, and
    ``q_scale`` still multiplies the softmax scale), and ``fp8_q`` is the fp8 dtype run() takes
    (None otherwise)."""
    q_dtype = canonical_dtype("q_data_type", q_data_type, torch.float16, Q_DTYPES + FP8_DTYPES)
    fp8_q = None
    if q_dtype in FP8_DTYPES:
        if o_data_type is None:
            raise ValueError(f"q_data_type={q_dtype} needs o_data_type (float16 or bfloat16): the "
                             "output is not fp8")
        fp8_q = q_dtype
        q_dtype = canonical_dtype("o_data_type", o_data_type, None, (torch.float16, torch.bfloat16))
    kv_dtype = canonical_dtype("kv_data_type", kv_data_type, fp8_q or q_dtype, KV_DTYPES)
    o_dtype = canonical_dtype("o_data_type", o_data_type, q_dtype, Q_DTYPES)
    return q_dtype, kv_dtype, o_dtype, fp8_q


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def index_array(name: str, t) -> torch.Tensor:
    """``t`` itself, once checked to be a 1-D int32 tensor (on any device)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32 (int64 indexes wrongly upstream), got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t


def host_index_arrays(*named: tuple[str, object]) -> list[torch.Tensor]:
    """:func:`index_array` of every ``(name, tensor)``, with the arrays that live on a GPU brought
    to the host in one copy (one synchronisation for all of them, not one each)."""
    arrays = [index_array(name, t) for name, t in named]
    out = [t.clone() if t.device.type == "cpu" else None for t in arrays]
    remote = [i for i, t in enumerate(arrays) if t.device.type != "cpu"]
    if len(remote) > 1 and len({arrays[i].device for i in remote}) == 1:
        host = torch.cat([arrays[i] for i in remote]).to("cpu")
        for i, part in zip(remote, host.split([arrays[i].shape[0] for i in remote])):
            out[i] = part
    else:
        for i in remote:
            out[i] = arrays[i].to("cpu")
    return out


def host_index_numpy(*named: tuple[str, object]) -> list[np.ndarray]:
    """:func:`host_index_arrays` as numpy arrays of their own (a CPU tensor is copied: the
    plan keeps what it was given)."""
    arrays = [index_array(name, t) for name, t in named]
    if all(t.device.type == "cpu" for t in arrays):
        return [t.numpy().copy() for t in arrays]
    return [t.numpy() for t in host_index_arrays(*named)]


def _np(a) -> np.ndarray:
    """A host array as numpy (numpy on the host copy: a few microseconds less per op than
    torch)."""
    return a if isinstance(a, np.ndarray) else a.numpy()


def check_indptr(name: str, host, batch_size: int | None = None) -> None:
    """``host``: the CPU copy (tensor or numpy) of an indptr array."""
    a = _np(host)
    if a.shape[0] < 1 or (batch_size is not None and a.shape[0] != batch_size + 1):
        want = "batch_size + 1" if batch_size is None else str(batch_size + 1)
        raise ValueError(f"{name} must have length {want}, got {a.shape[0]}")
    if a[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(a[0])}")
    if a.shape[0] > 1 and bool((a[1:] < a[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing (monotone), got {a.tolist()[:16]}")


def paged_kv_lens(indptr, last_page_len, page_size: int) -> torch.Tensor:
    """kv length per request on the host (int32 CPU tensor) from the CPU copies (tensor or
    numpy) of ``indptr`` and ``last_page_len``; checks ``last_page_len`` against ``page_size``."""
    ind, last = _np(indptr), _np(last_page_len)
    pages = ind[1:] - ind[:-1]
    # a request with pages needs last in [1, page_size]; one without, last in [0, page_size]
    if bool(((last < (pages > 0)) | (last > page_size)).any()):
        raise ValueError(f"paged_kv_last_page_len must be in [1, page_size={page_size}] for every "
                         f"request with pages, got {last.tolist()[:16]}")
    lens = pages * page_size
    lens += last - page_size
    np.maximum(lens, 0, out=lens)  # no page: length 0
    return torch.from_numpy(lens.astype(np.int32, copy=False))


def page_indices(name: str, t: torch.Tensor, n_pages: int, indptr_name: str = "indptr",
                 deferred: bool = False) -> tuple[torch.Tensor, "int | DeviceIdsCheck"]:
    """The first ``n_pages`` entries of a validated int32 page-id array (a view, on its own
    device; the plan's upload copies it), checked ``>= 0``, and their largest id (-1 when
    empty, or when not known: see below). A device array, ``deferred`` (a wrapper's plan(),
    whose upload brings the ids to the host): a :class:`DeviceIdsCheck` in place of the id,
    resolved at the end of plan(); not deferred: checked on a host copy, one synchronisation
    here. With ``FLASHINFER_TRUST_DEVICE_PAGE_IDS=1`` a device array is not checked (-1)."""
    if t.shape[0] < n_pages:
        raise ValueError(f"{name} must hold {indptr_name}[-1]={n_pages} page ids, got {t.shape[0]}")
    ids = t if t.shape[0] == n_pages else t[:n_pages]
    if not n_pages:
        return ids, -1
    if ids.device.type == "cpu":
        return ids, largest_page_id(ids.numpy(), name)
    if envs.TRUST_DEVICE_PAGE_IDS.get():
        return ids, -1
    if deferred:
        return ids, DeviceIdsCheck(name)
    return ids, largest_page_id(ids.cpu().numpy(), name)


def largest_page_id(ids: np.ndarray, name: str) -> int:
    """The largest of int32 page ids, ValueError naming ``name`` when one is negative: one
    reduction over the ids seen as uint32, where a negative id is above every valid one."""
    hi = int(ids.view(np.uint32).max())
    if hi > 0x7FFFFFFF:
        raise ValueError(f"{name} must be >= 0 (page ids into the cache), got {int(ids.min())}")
    return hi


class DeviceIdsCheck(NamedTuple):
    """The bounds check of device page ids, left to the end of plan(): the plan's upload
    copies them to the host on their way (``PlanUpload.host_copy("kv_indices")``)."""

    name: str  # the argument, for the error

    def resolve(self, upload: PlanUpload) -> int:
        """The largest id; ValueError when an id is negative."""
        return largest_page_id(upload.host_copy("kv_indices"), self.name)


def check_fixed_buffer(name: str, buf, device: torch.device, length: int | None = None) -> torch.Tensor:
    if buf is None:
        raise ValueError(f"use_cuda_graph=True requires {name} (a fixed int32 buffer on the device)")
    if not isinstance(buf, torch.Tensor) or buf.dtype != torch.int32 or buf.dim() != 1:
        raise ValueError(f"{name} must be a 1-D int32 tensor, got "
                         f"{getattr(buf, 'dtype', type(buf).__name__)} {tuple(getattr(buf, 'shape', ()))}")
    if buf.device != device:
        raise ValueError(f"{name} is on {buf.device} but the workspace buffer is on {device}")
    if length is not None and buf.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {buf.shape[0]}")
    return buf


def planned_device_fields(arrays: dict, fixed: dict) -> dict:
    """A plan's device fields before its upload: the fixed buffers' views (a CUDA-graph
    wrapper), else None (set by the upload, see ``_finish_plan``)."""
    return {name: (None if fixed.get(name) is None else fixed[name][:t.shape[0]])
            for name, t in arrays.items()}


def workspace_bytes(name: str, buffer) -> torch.Tensor:
    """A workspace buffer as the raw bytes the planners carve (a 1-D uint8 view, no copy).
    Upstream treats the buffer as bytes of any dtype (int8, uint8, float, ...); it must be one
    dense block of memory (contiguous): ``TypeError`` / ``ValueError`` naming ``name``."""
    if not isinstance(buffer, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (any dtype, e.g. 128 MiB of uint8), got "
                        f"{type(buffer).__name__}")
    if not buffer.is_contiguous():
        raise ValueError(f"{name} must be contiguous (one block of bytes), got shape "
                         f"{tuple(buffer.shape)} with strides {buffer.stride()}")
    return buffer.reshape(-1).view(torch.uint8)


def require_workspace(plan: BatchPlan, nbytes: int, who: str) -> torch.Tensor:
    """For planners: ``nbytes`` of ``plan.workspace`` as uint8, or a ValueError stating the need."""
    ws = plan.workspace
    have = 0 if ws is None else ws.numel() * ws.element_size()
    if have < nbytes:
        raise ValueError(f"float_workspace_buffer too small for {who}: needs {nbytes} bytes "
                         f"({nbytes / 2**20:.1f} MiB), has {have}")
    return ws.view(torch.uint8)[:nbytes]


def scale_arg(name: str, value) -> float:
    if value is None:
        return 1.0
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{name} as a tensor is taken for k_scale / v_scale only "
                        "(flashinfer.attention.scales); pass a Python float")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite float or None, got {value!r}")
    return float(value)


def unpack_segments(packed: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Per-request little-bit-order packed masks (``segment_packbits``) -> flat bool mask."""
    bits = ((packed.to(torch.int32)[:, None] >> torch.arange(8, device=packed.device)) & 1).flatten()
    index, byte = [], 0
    for n in sizes:
        index.append(torch.arange(byte * 8, byte * 8 + n))
        byte += (n + 7) // 8
    if byte != packed.shape[0]:
        raise ValueError(f"packed_custom_mask must hold {byte} bytes for these lengths, got {packed.shape[0]}")
    return bits[torch.cat(index).to(packed.device)].to(torch.bool)


def paged_kv_pages(paged_kv_cache, plan: BatchPlan, max_page: int, check_kv, indices_name: str):
    """Split the cache into page views and check them against the plan (metadata only);
    ``indices_name``: plan()'s page-id argument, for the message."""
    k_cache, v_cache = unpack_paged_kv_cache(paged_kv_cache, plan.kv_layout)
    check_kv("k_cache", k_cache, plan)
    check_kv("v_cache", v_cache, plan)
    nhd = plan.kv_layout == "NHD"
    page_size, heads = (k_cache.shape[1], k_cache.shape[2]) if nhd else (k_cache.shape[2], k_cache.shape[1])
    if page_size != plan.page_size:
        raise ValueError(f"paged_kv_cache page_size {page_size} differs from the planned {plan.page_size}")
    if heads != plan.num_kv_heads:
        raise ValueError(f"paged_kv_cache has {heads} kv heads, the plan {plan.num_kv_heads}")
    if k_cache.shape[-1] != plan.head_dim_qk or v_cache.shape[-1] != plan.head_dim_vo:
        raise ValueError(f"paged_kv_cache head dims ({k_cache.shape[-1]}, {v_cache.shape[-1]}) differ "
                         f"from the planned ({plan.head_dim_qk}, {plan.head_dim_vo})")
    if max_page >= k_cache.shape[0]:
        raise ValueError(f"{indices_name} given to plan() holds page id {max_page}, beyond the "
                         f"{k_cache.shape[0]} pages of paged_kv_cache; allowed: page ids in "
                         f"[0, {k_cache.shape[0]})")
    return k_cache, v_cache


class PagedCacheViews:
    """A wrapper's run() page views (:func:`paged_kv_pages`) of the caches it has been given,
    remembered by cache identity and layout. The steady state of a serving step (each layer's
    cache tensor, the same object every step) then reads the cache's address, shape and strides
    and compares its facts with the plan's in one tuple, instead of unpacking and re-checking it;
    anything else (a new cache, a changed one, a mismatch) takes :func:`paged_kv_pages`, which
    raises what it raises. Holds references to at most :attr:`LIMIT` caches (the wrapper's
    life)."""

    LIMIT = 512

    def __init__(self):
        self._seen: dict[tuple, tuple] = {}
        self._plan_facts: tuple = (None, None)  # (plan, what a cache must match for it)

    def kv(self, paged_kv_cache, plan: BatchPlan, max_page: int, check_kv,
           indices_name: str) -> KVInput:
        if isinstance(paged_kv_cache, torch.Tensor):
            tensors = (paged_kv_cache,)
            key = (id(paged_kv_cache), plan.kv_layout)
        elif isinstance(paged_kv_cache, (tuple, list)) and len(paged_kv_cache) == 2:
            tensors = tuple(paged_kv_cache)
            key = (id(tensors[0]), id(tensors[1]), plan.kv_layout)
        else:
            tensors = key = None
        entry = self._seen.get(key) if key is not None else None
        if entry is not None:
            held, fingerprint, facts, pages, kv = entry
            if (_same(held, tensors) and fingerprint == _fingerprint(tensors)
                    and facts == self._facts(plan) and max_page < pages):
                return kv
        k_cache, v_cache = paged_kv_pages(paged_kv_cache, plan, max_page, check_kv, indices_name)
        kv = KVInput(k_cache, v_cache, {})
        if key is not None and all(isinstance(t, torch.Tensor) for t in tensors):
            if len(self._seen) >= self.LIMIT:
                self._seen.clear()
            self._seen[key] = (tensors, _fingerprint(tensors), self._facts(plan), k_cache.shape[0],
                               kv)
        return kv

    def _facts(self, plan: BatchPlan) -> tuple:
        """What :func:`paged_kv_pages` checks a cache against, as the cache must match it
        (kept for the last plan: one per serving step, many run() calls)."""
        known, facts = self._plan_facts
        if known is not plan:
            facts = (plan.kv_dtype, plan.device, plan.page_size, plan.num_kv_heads,
                     plan.head_dim_qk, plan.head_dim_vo)
            self._plan_facts = (plan, facts)
        return facts


def _same(held: tuple, tensors: tuple) -> bool:
    return held[0] is tensors[0] and (len(held) == 1 or held[1] is tensors[1])


def _fingerprint(tensors: tuple) -> tuple:
    """The cache's address, shape and strides (what an in-place resize or re-stride changes)."""
    t = tensors[0]
    first = (t.data_ptr(), t.shape, t.stride())
    if len(tensors) == 1:
        return first
    t = tensors[1]
    return first + (t.data_ptr(), t.shape, t.stride())


__all__ = ["PagedCacheViews", "canonical_dtype", "positive_int", "index_array", "host_index_arrays", "check_indptr",
           "paged_kv_lens", "page_indices", "largest_page_id", "DeviceIdsCheck",
           "check_fixed_buffer", "planned_device_fields", "require_workspace", "workspace_bytes", "scale_arg",
           "unpack_segments", "paged_kv_pages", "plan_dtypes", "Q_DTYPES", "FP8_DTYPES",
           "KV_DTYPES"]
