"""Rotary position embedding (RoPE) of queries and keys: FlashInfer's ``flashinfer.rope`` API.

Math (api-spec.md §7.2), for pair index ``d in [0, rotary_dim/2)``, computed in float32:

* ``f_d = rope_theta ** (-2d / rotary_dim)``; standard RoPE: ``f'_d = f_d / rope_scale``;
* Llama 3.1: ``smooth = clamp(f_d * old_context_len / (2*pi*(high_freq_factor - low_freq_factor))
  - 1 / (high_freq_factor / low_freq_factor - 1), 0, 1)`` and
  ``f'_d = (1 - smooth) * f_d / rope_scale + smooth * f_d``;
* angle ``a = pos * f'_d`` (cos/sin cache variants read ``cos = cache[pos, d]``,
  ``sin = cache[pos, rotary_dim/2 + d]`` instead);
* pairs ``(x1, x2) = (x[d], x[d + rotary_dim/2])`` (``interleave=False``, NeoX "rotate half") or
  ``(x[2d], x[2d+1])`` (``interleave=True``, GPT-J); ``x1' = x1 cos a - x2 sin a``,
  ``x2' = x2 cos a + x1 sin a``; dims ``>= rotary_dim`` pass through unchanged.

Canonical kernel signature (every backend's ``"rope"`` kernel takes exactly this)::

    kernel(q, k, q_out, k_out, pos_ids, params, cos_sin_cache) -> None

* ``q [nnz, H_q, head_dim]``, ``k [nnz, H_k, head_dim]``: fp16/bf16/fp32 views with any strides;
* ``q_out``, ``k_out``: same shapes and dtype; the *same objects* as ``q``, ``k`` for in-place
  calls (the kernel must then read each element before overwriting it), else fresh tensors
  that the kernel fills completely (rotated dims and the pass-through dims);
* ``pos_ids [nnz]`` int32/int64 on the device of ``q`` (ragged ``indptr``/``offsets`` calls are
  turned into positions here, so kernels only ever see positions);
* ``params``: :class:`RopeParams`; with a cache only ``rotary_dim``, ``interleave`` and
  ``positions_fault`` count;
* ``cos_sin_cache``: ``None`` (frequencies computed from ``params``) or fp32
  ``[max_pos, rotary_dim]``. A position outside ``[0, max_pos)`` must never be read: the kernel
  stores that token unrotated (its input values, bit for bit) and, when
  ``params.positions_fault`` is set (GPU calls without a host check), reports it into the
  device's error record (:mod:`flashinfer.index_checks`).

What is checked: ranks, dtypes, devices, matching token counts and head dims, ``rotary_dim`` even
and ``<= head_dim``; ``rope_scale``, ``rope_theta`` and the Llama 3.1 factors finite, > 0 and
normal float32 numbers (the kernels compute in float32), ``high_freq_factor > low_freq_factor``
and far enough apart that the smoothing coefficients are finite in float32; index sizes; the
cache's dtype, rank and width; and destructive aliasing: the ``*_inplace`` variants write
``q``/``k`` (``query``/``key``) while reading the other one and the index / cache arguments, so
any shared memory between them raises ``ValueError`` (views of one packed ``qkv`` buffer that
do not overlap are fine); non-inplace variants write fresh tensors.

Index values follow :mod:`flashinfer.index_checks`. ``positions`` of the cache variants index
rows of ``cos_sin_cache``: each must be in ``[0, max_pos)``. ``indptr`` of the ragged variants
must start at 0, never decrease and end at ``nnz`` (entries past ``nnz`` are bad too).
``offsets`` and ``pos_ids`` index nothing (positions are numbers in the formula), so any
integer is allowed, negative included. Host (CPU) index arrays are checked before any kernel
runs (``ValueError`` naming the function, the argument, its first bad entry and the rule); on
a GPU (unless ``FLASHINFER_CHECK_INDICES=1``) nothing is read back: a token with a bad cache
position is left unrotated (the output equals the input, bit for bit; in place: unchanged)
and the cache is not read for it; a bad ``indptr`` rotates every token by position 0 (angle 0,
i.e. unchanged for finite values). Either fault is recorded in the device's error record and
raised by ``flashinfer.check_errors()``.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple

import torch

from . import dispatch, index_checks
from .aliasing import check_no_overlap, check_writable
from .api_logging import flashinfer_api
from .custom_op import custom_op
from .dispatch import Problem
from .index_checks import Check, fault
from .rope_params import Llama31Factors, RopeParams

__all__ = [
    "Llama31Factors", "RopeParams",
    "apply_rope", "apply_rope_inplace", "apply_rope_pos_ids", "apply_rope_pos_ids_inplace",
    "apply_llama31_rope", "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace", "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace", "rope_quantize_fp8", "mla_rope_quantize_fp8",
    "rope_quantize_fp8_append_paged_kv_cache",
]


_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)
_FP32_TINY, _FP32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38

_RAGGED = ("apply_rope", "apply_rope_inplace", "apply_llama31_rope", "apply_llama31_rope_inplace")
_CACHED = ("apply_rope_with_cos_sin_cache", "apply_rope_with_cos_sin_cache_inplace")
#: the index rules (:mod:`flashinfer.index_checks`), one fault per public function
INDPTR_FAULTS = {fn: fault(fn, "indptr", "non-decreasing token offsets from indptr[0] = 0 to "
                                          "indptr[-1] = nnz = {bound} (the tokens of q and k)")
                 for fn in _RAGGED}
POSITIONS_FAULTS = {fn: fault(fn, "positions", "a row of cos_sin_cache: [0, max_pos = {bound})")
                    for fn in _CACHED}
POSITIONS_FAULTS["rope_quantize_fp8"] = fault("rope_quantize_fp8", "pos_ids",
                                              "a row of cos_sin_cache: [0, max_pos = {bound})")


# --------------------------------------------------------------------------------------------
# validation


def _tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _check_qk(q: torch.Tensor, k: torch.Tensor, qn: str = "q", kn: str = "k") -> None:
    for name, t in ((qn, q), (kn, k)):
        if _tensor(name, t).dim() != 3:
            raise ValueError(f"{name} must be 3-D [nnz, num_heads, head_dim], got shape {tuple(t.shape)}")
    if q.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{qn} dtype {q.dtype} is not supported; allowed: float16, bfloat16, float32")
    if k.dtype != q.dtype:
        raise TypeError(f"{kn} dtype {k.dtype} must equal {qn} dtype {q.dtype}")
    if k.device != q.device:
        raise ValueError(f"{kn} is on {k.device} but {qn} is on {q.device}; both must be on one device")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"{kn} has {k.shape[0]} tokens (shape[0]) but {qn} has {q.shape[0]}; "
                         "they must match")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"{kn} head_dim {k.shape[2]} must equal {qn} head_dim {q.shape[2]}")


def _check_index(name: str, t, device: torch.device, length: int | None = None) -> torch.Tensor:
    _tensor(name, t)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} dtype {t.dtype} is not supported; allowed: int32, int64")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the queries are on {device}; move it there")
    if length is not None and t.numel() != length:
        raise ValueError(f"{name} has {t.numel()} entries, expected {length} (one per token)")
    return t


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} is not allowed; it must be finite and > 0")
    if not _FP32_TINY <= value <= _FP32_MAX:
        raise ValueError(f"{name}={value!r} is not allowed; it must be a normal float32 number, "
                         f"in [{_FP32_TINY:.4g}, {_FP32_MAX:.4g}] (the kernels compute in float32)")
    return float(value)


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _rotary_dim(rotary_dim, head_dim: int) -> int:
    if rotary_dim is None:
        rotary_dim = head_dim
    elif isinstance(rotary_dim, bool) or not isinstance(rotary_dim, numbers.Integral):
        raise TypeError(f"rotary_dim must be an int or None, got {type(rotary_dim).__name__}")
    rotary_dim = int(rotary_dim)
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim={rotary_dim} is not allowed; it must be even and in "
                         f"[2, head_dim={head_dim}] (None means head_dim)")
    return rotary_dim


def _params(q: torch.Tensor, rotary_dim, interleave, rope_scale, rope_theta,
            llama31: tuple | None = None) -> RopeParams:
    factors = None
    if llama31 is not None:
        low, high, old = llama31
        low = _positive("low_freq_factor", low)
        high = _positive("high_freq_factor", high)
        if high <= low:
            raise ValueError(f"high_freq_factor={high} must be greater than low_freq_factor={low}")
        factors = Llama31Factors(low, high, _positive("old_context_len", old))
        if not all(abs(c) <= _FP32_MAX for c in factors.smooth_coefficients()):
            raise ValueError(f"high_freq_factor={high} and low_freq_factor={low} are too close "
                             f"(old_context_len={old}): the smoothing ramp's coefficients "
                             "overflow float32")
    return RopeParams(_rotary_dim(rotary_dim, q.shape[2]), _flag("interleave", interleave),
                      _positive("rope_scale", rope_scale), _positive("rope_theta", rope_theta),
                      factors)


def _ragged_positions(function: str, indptr, offsets, q: torch.Tensor) -> torch.Tensor:
    """Validate a ragged batch; every token's position ``[nnz]`` int64 (no host sync on GPU:
    a bad ``indptr`` there is recorded and every position becomes 0)."""
    _check_index("offsets", offsets, q.device)
    _check_index("indptr", indptr, q.device, offsets.numel() + 1)
    nnz = q.shape[0]
    check = _indptr_check(function, indptr, nnz)
    if index_checks.host_check_wanted(q.device):
        index_checks.raise_first([check])
        return _segment_positions(indptr, offsets, nnz)
    index_checks.report_device(check)
    return _segment_positions(indptr, offsets, nnz).masked_fill(check.bad.any(), 0)


def _indptr_check(function: str, indptr: torch.Tensor, nnz: int) -> Check:
    """Entry ``i`` of ``indptr`` must lie in ``[indptr[i - 1], nnz]``; the first must be 0, the
    last ``nnz`` (device ops only)."""
    ind = indptr.long()
    lower = torch.cat((ind.new_zeros(1), ind[:-1]))
    lower[-1] = nnz
    upper = torch.full_like(ind, nnz)
    upper[0] = 0
    return Check(INDPTR_FAULTS[function], (ind < lower) | (ind > upper), ind, nnz)


def _segment_positions(indptr: torch.Tensor, offsets: torch.Tensor, nnz: int) -> torch.Tensor:
    """``offsets[i] + j`` for token ``j`` of segment ``i``; 0 for tokens outside every segment."""
    batch = offsets.numel()
    tokens = torch.arange(nnz, device=indptr.device, dtype=torch.int64)
    if batch == 0:
        return torch.zeros_like(tokens)
    starts = indptr.to(torch.int64)
    seg = torch.searchsorted(starts, tokens, right=True) - 1
    inside = (seg >= 0) & (seg < batch)
    seg = seg.clamp(0, batch - 1)
    pos = offsets.to(torch.int64)[seg] + tokens - starts[seg]
    return torch.where(inside, pos, torch.zeros_like(pos))


def _cache_inputs(function: str, positions, query, key, head_size, cos_sin_cache, is_neox):
    """Validate a vLLM-style call; returns ``(q, k, pos, params)`` with 3-D views of query/key."""
    if isinstance(head_size, bool) or not isinstance(head_size, numbers.Integral) or head_size <= 0:
        raise ValueError(f"head_size must be a positive int, got {head_size!r}")
    views = []
    for name, t in (("query", query), ("key", key)):
        if _tensor(name, t).dim() not in (2, 3):
            raise ValueError(f"{name} must be [nnz, num_heads*head_size] or [nnz, num_heads, "
                             f"head_size], got shape {tuple(t.shape)}")
        if (t.dim() == 3 and t.shape[2] != head_size) or (t.dim() == 2 and t.shape[1] % head_size):
            raise ValueError(f"{name} shape {tuple(t.shape)} does not hold whole heads of "
                             f"head_size={head_size}")
        heads = t.shape[1] // head_size if t.dim() == 2 else t.shape[1]
        views.append(t.view(t.shape[0], heads, head_size))  # splits or keeps dims: any strides
    q, k = views
    _check_qk(q, k, "query", "key")
    cache = _tensor("cos_sin_cache", cos_sin_cache)
    if cache.dtype != torch.float32:
        raise ValueError(f"cos_sin_cache must be float32, got {cache.dtype}")
    if cache.dim() != 2:
        raise ValueError(f"cos_sin_cache must be 2-D [max_pos, rotary_dim], got shape {tuple(cache.shape)}")
    if cache.device != q.device:
        raise ValueError(f"cos_sin_cache is on {cache.device} but query is on {q.device}")
    if cache.shape[0] == 0:
        raise ValueError("cos_sin_cache has no rows (max_pos = 0): no position can be looked up")
    width = cache.shape[1]
    if width <= 0 or width % 2 or width > head_size:
        raise ValueError(f"cos_sin_cache width {width} is its rotary_dim: it must be even and in "
                         f"[2, head_size={head_size}]")
    pos = _check_index("positions", positions, q.device, q.shape[0])
    interleave = not _flag("is_neox", is_neox)
    rule = POSITIONS_FAULTS[function]
    if index_checks.host_check_wanted(q.device):
        p, max_pos = pos.long(), cache.shape[0]
        index_checks.raise_first([Check(rule, (p < 0) | (p >= max_pos), p, max_pos)])
        rule = None
    return q, k, pos, RopeParams(width, interleave, positions_fault=rule)


def _check_inplace(function: str, q: torch.Tensor, k: torch.Tensor, names: tuple[str, str],
                   **read) -> None:
    """The in-place variants write ``q`` and ``k`` while they read the other one and ``read``:
    no memory may be shared (:mod:`flashinfer.aliasing`)."""
    qn, kn = names
    check_writable(function, qn, q)
    check_writable(function, kn, k)
    check_no_overlap(function, qn, q, **{kn: k}, **read)
    check_no_overlap(function, kn, k, **read)


# --------------------------------------------------------------------------------------------
# dispatch


def _problem(q, k, pos, params: RopeParams, cached: bool, inplace: bool) -> Problem:
    features = [name for name, used in (
        ("interleave", params.interleave), ("llama31", params.llama31 is not None),
        ("partial_rotary", params.rotary_dim < q.shape[2]), ("cos_sin_cache", cached),
        ("inplace", inplace)) if used]
    return Problem.make(
        "rope", q.device, dtypes={"input": q.dtype, "pos": pos.dtype},
        shape={"head_dim": q.shape[2], "rotary_dim": params.rotary_dim, "num_q_heads": q.shape[1],
               "num_k_heads": k.shape[1], "num_tokens": dispatch.length_bucket(q.shape[0])},
        features=features)


def _run(q, k, q_out, k_out, pos, params, cache, backend) -> None:
    problem = _problem(q, k, pos, params, cache is not None, q_out is q)
    dispatch.decide(problem, backend).kernel(q, k, q_out, k_out, pos, params, cache)


def _rope(q, k, pos, params, inplace: bool, backend: str):
    if inplace:
        _run(q, k, q, k, pos, params, None, backend)
        return None
    q_rope, k_rope = torch.empty_like(q), torch.empty_like(k)
    _run(q, k, q_rope, k_rope, pos, params, None, backend)
    return q_rope, k_rope


def _fake_pair(q, k, *args, **kwargs):
    return torch.empty_like(q), torch.empty_like(k)


def _fake_cache_pair(positions, query, key, *args, **kwargs):
    return torch.empty_like(query), torch.empty_like(key)


def _fake_none(*args, **kwargs):
    return None


# --------------------------------------------------------------------------------------------
# public API (upstream names, argument order and defaults; ``backend`` is ours)

_QK_DOC = """
    ``q [nnz, num_q_heads, head_dim]`` and ``k [nnz, num_k_heads, head_dim]`` (fp16/bf16/fp32,
    any strides); the first ``rotary_dim`` (default ``head_dim``, even) dims of every head
    rotate, the rest pass through. ``interleave=False`` pairs ``(x[d], x[d+rotary_dim/2])``,
    ``True`` pairs ``(x[2d], x[2d+1])``. ``backend``: ``"auto"`` or a backend name (module
    docstring: math, and what is checked)."""
_RAGGED_DOC = """
    Ragged batch: ``indptr [batch+1]`` and ``offsets [batch]`` (int32/int64, on q's device);
    token ``j`` of segment ``i`` (``q[indptr[i]:indptr[i+1]]``) sits at ``offsets[i] + j``."""
_POS_DOC = """
    ``pos_ids [nnz]`` (int32/int64, on q's device): the position of every token."""
_LLAMA_DOC = """
    Llama 3.1 frequencies: low frequencies are divided by ``rope_scale``, high ones kept, with a
    smooth ramp between the ``low_freq_factor`` and ``high_freq_factor`` wavelength bounds."""


@flashinfer_api
@custom_op("apply_rope", fake=_fake_pair)
def apply_rope(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
               rotary_dim: Optional[int] = None, interleave: bool = False, rope_scale: float = 1.0,
               rope_theta: float = 1e4, backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    _check_qk(q, k)
    pos = _ragged_positions("apply_rope", indptr, offsets, q)
    return _rope(q, k, pos, _params(q, rotary_dim, interleave, rope_scale, rope_theta), False, backend)


@flashinfer_api
@custom_op("apply_rope_inplace", mutates_args=("q", "k"), fake=_fake_none)
def apply_rope_inplace(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
                       rotary_dim: Optional[int] = None, interleave: bool = False,
                       rope_scale: float = 1.0, rope_theta: float = 1e4, backend: str = "auto") -> None:
    _check_qk(q, k)
    _check_inplace("apply_rope_inplace", q, k, ("q", "k"), indptr=indptr, offsets=offsets)
    pos = _ragged_positions("apply_rope_inplace", indptr, offsets, q)
    _rope(q, k, pos, _params(q, rotary_dim, interleave, rope_scale, rope_theta), True, backend)


@flashinfer_api
@custom_op("apply_rope_pos_ids", fake=_fake_pair)
def apply_rope_pos_ids(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                       rotary_dim: Optional[int] = None, interleave: bool = False,
                       rope_scale: float = 1.0, rope_theta: float = 1e4, backend: str = "auto"
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    _check_qk(q, k)
    pos = _check_index("pos_ids", pos_ids, q.device, q.shape[0])
    return _rope(q, k, pos, _params(q, rotary_dim, interleave, rope_scale, rope_theta), False, backend)


@flashinfer_api
@custom_op("apply_rope_pos_ids_inplace", mutates_args=("q", "k"), fake=_fake_none)
def apply_rope_pos_ids_inplace(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                               rotary_dim: Optional[int] = None, interleave: bool = False,
                               rope_scale: float = 1.0, rope_theta: float = 1e4,
                               backend: str = "auto") -> None:
    _check_qk(q, k)
    _check_inplace("apply_rope_pos_ids_inplace", q, k, ("q", "k"), pos_ids=pos_ids)
    pos = _check_index("pos_ids", pos_ids, q.device, q.shape[0])
    _rope(q, k, pos, _params(q, rotary_dim, interleave, rope_scale, rope_theta), True, backend)


@flashinfer_api
@custom_op("apply_llama31_rope", fake=_fake_pair)
def apply_llama31_rope(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor,
                       offsets: torch.Tensor, rotary_dim: Optional[int] = None,
                       interleave: bool = False, rope_scale: float = 8.0, rope_theta: float = 5e5,
                       low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                       old_context_len: int = 8192, backend: str = "auto"
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    _check_qk(q, k)
    pos = _ragged_positions("apply_llama31_rope", indptr, offsets, q)
    params = _params(q, rotary_dim, interleave, rope_scale, rope_theta,
                     (low_freq_factor, high_freq_factor, old_context_len))
    return _rope(q, k, pos, params, False, backend)


@flashinfer_api
@custom_op("apply_llama31_rope_inplace", mutates_args=("q", "k"), fake=_fake_none)
def apply_llama31_rope_inplace(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor,
                               offsets: torch.Tensor, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 8.0,
                               rope_theta: float = 5e5, low_freq_factor: float = 1.0,
                               high_freq_factor: float = 4.0, old_context_len: int = 8192,
                               backend: str = "auto") -> None:
    _check_qk(q, k)
    _check_inplace("apply_llama31_rope_inplace", q, k, ("q", "k"), indptr=indptr, offsets=offsets)
    pos = _ragged_positions("apply_llama31_rope_inplace", indptr, offsets, q)
    params = _params(q, rotary_dim, interleave, rope_scale, rope_theta,
                     (low_freq_factor, high_freq_factor, old_context_len))
    _rope(q, k, pos, params, True, backend)


@flashinfer_api
@custom_op("apply_llama31_rope_pos_ids", fake=_fake_pair)
def apply_llama31_rope_pos_ids(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                               rotary_dim: Optional[int] = None, interleave: bool = False,
                               rope_scale: float = 8.0, rope_theta: float = 5e5,
                               low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                               old_context_len: int = 8192, backend: str = "auto"
                               ) -> Tuple[torch.Tensor, torch.Tensor]:
    _check_qk(q, k)
    pos = _check_index("pos_ids", pos_ids, q.device, q.shape[0])
    params = _params(q, rotary_dim, interleave, rope_scale, rope_theta,
                     (low_freq_factor, high_freq_factor, old_context_len))
    return _rope(q, k, pos, params, False, backend)


@flashinfer_api
@custom_op("apply_llama31_rope_pos_ids_inplace", mutates_args=("q", "k"), fake=_fake_none)
def apply_llama31_rope_pos_ids_inplace(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                                       rotary_dim: Optional[int] = None, interleave: bool = False,
                                       rope_scale: float = 8.0, rope_theta: float = 5e5,
                                       low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                                       old_context_len: int = 8192, backend: str = "auto") -> None:
    _check_qk(q, k)
    _check_inplace("apply_llama31_rope_pos_ids_inplace", q, k, ("q", "k"), pos_ids=pos_ids)
    pos = _check_index("pos_ids", pos_ids, q.device, q.shape[0])
    params = _params(q, rotary_dim, interleave, rope_scale, rope_theta,
                     (low_freq_factor, high_freq_factor, old_context_len))
    _rope(q, k, pos, params, True, backend)


@flashinfer_api
@custom_op("apply_rope_with_cos_sin_cache", fake=_fake_cache_pair)
def apply_rope_with_cos_sin_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                  head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True,
                                  backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """vLLM/SGLang-style RoPE with a precomputed cache; returns new ``(query, key)``.

    ``positions [nnz]`` int32/int64; ``query [nnz, num_q_heads*head_size]`` (or 3-D
    ``[nnz, num_q_heads, head_size]``), ``key`` likewise; ``cos_sin_cache [max_pos, rotary_dim]``
    float32, cos in the first half of each row and sin in the second; ``rotary_dim`` is the
    cache width. ``is_neox=True`` is ``interleave=False``. Outputs keep the input shapes.
    """
    q, k, pos, params = _cache_inputs("apply_rope_with_cos_sin_cache", positions, query, key,
                                      head_size, cos_sin_cache, is_neox)
    query_out, key_out = torch.empty_like(query), torch.empty_like(key)
    _run(q, k, query_out.view(q.shape), key_out.view(k.shape), pos, params, cos_sin_cache, backend)
    return query_out, key_out


@flashinfer_api
@custom_op("apply_rope_with_cos_sin_cache_inplace", mutates_args=("query", "key"), fake=_fake_none)
def apply_rope_with_cos_sin_cache_inplace(positions: torch.Tensor, query: torch.Tensor,
                                          key: torch.Tensor, head_size: int,
                                          cos_sin_cache: torch.Tensor, is_neox: bool = True,
                                          backend: str = "auto") -> None:
    """In-place form of :func:`apply_rope_with_cos_sin_cache` (rotates ``query`` and ``key``)."""
    fn = "apply_rope_with_cos_sin_cache_inplace"
    q, k, pos, params = _cache_inputs(fn, positions, query, key, head_size, cos_sin_cache, is_neox)
    _check_inplace(fn, query, key, ("query", "key"), positions=positions,
                   cos_sin_cache=cos_sin_cache)
    _run(q, k, q, k, pos, params, cos_sin_cache, backend)


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _fp8_scale(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite float, got {value!r}")
    return float(value)


def _saturated(x32: torch.Tensor, scale: float, dtype: torch.dtype, out, name: str) -> torch.Tensor:
    """``fp8(x32 * scale)`` in ``dtype``, saturating at its largest finite value (NaN stays NaN),
    rounded to nearest even; written into ``out`` (checked) or a new tensor."""
    y = (x32 * scale).clamp_(-torch.finfo(dtype).max, torch.finfo(dtype).max)
    if out is None:
        return y.to(dtype)
    if not isinstance(out, torch.Tensor) or out.dtype != dtype or out.shape != y.shape \
            or out.device != y.device:
        raise ValueError(f"{name} must be a {dtype} tensor of shape {tuple(y.shape)} on {y.device}, "
                         f"got {getattr(out, 'dtype', type(out).__name__)} "
                         f"{tuple(getattr(out, 'shape', ()))}")
    out.copy_(y)
    return out


@flashinfer_api
def rope_quantize_fp8(q_rope: torch.Tensor, k_rope: torch.Tensor, q_nope: Optional[torch.Tensor],
                      k_nope: Optional[torch.Tensor], cos_sin_cache: torch.Tensor,
                      pos_ids: torch.Tensor, is_neox: bool = True,
                      quantize_dtype: Optional[torch.dtype] = None, quant_scale_q: float = 1.0,
                      quant_scale_kv: float = 1.0, q_rope_out: Optional[torch.Tensor] = None,
                      k_rope_out: Optional[torch.Tensor] = None,
                      q_nope_out: Optional[torch.Tensor] = None,
                      k_nope_out: Optional[torch.Tensor] = None, enable_pdl: bool = False, *,
                      backend: str = "auto"
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """RoPE of the rotary parts, then fp8 quantisation of all four parts, as upstream:
    ``fp8(rope(x) * quant_scale_q)`` for ``q_rope``, ``fp8(x * quant_scale_q)`` for ``q_nope``,
    the same with ``quant_scale_kv`` for the keys. Float32 from the load to the cast (no rounding
    between RoPE and the scale); the cast rounds to nearest even and saturates at the dtype's
    largest finite value (448 for e4m3, 57344 for e5m2), as upstream's kernels.

    ``q_rope [nnz, H_q, rope_dim]``, ``q_nope [nnz, H_q, no_rope_dim]`` or None; ``k_rope``
    ``[nnz, H_k, rope_dim]`` or 2-D ``[nnz, rope_dim]`` (MLA: ``k_nope`` then ``[nnz,
    no_rope_dim]``), ``k_nope`` likewise or None; fp16/bf16/fp32, one dtype.
    ``cos_sin_cache [max_pos, rope_dim]`` float32 (cos half, then sin half); ``pos_ids [nnz]``
    int32/int64 (rows of the cache: each in ``[0, max_pos)``); ``is_neox``: rotate-half (True)
    or interleaved pairs (False). ``quantize_dtype``: float8_e4m3fn (default, unless a given
    output says otherwise) or float8_e5m2. Given ``*_out`` tensors (the inputs' shapes) are
    written; the others are allocated; a None nope part gives an empty ``[..., 0]`` output.
    Returns ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)``. The RoPE runs on the
    dispatched ``rope`` op (``backend``) over float32 copies. ``enable_pdl`` is ignored.
    """
    fn = "rope_quantize_fp8"
    if _tensor("q_rope", q_rope).dim() != 3:
        raise ValueError(f"q_rope must be 3-D [nnz, num_q_heads, rope_dim], got {tuple(q_rope.shape)}")
    mla = _tensor("k_rope", k_rope).dim() == 2
    k3 = k_rope[:, None] if mla else k_rope
    rope_dim, nnz = q_rope.shape[2], q_rope.shape[0]
    for name, t, heads in (("q_nope", q_nope, q_rope.shape[1]), ("k_nope", k_nope, None)):
        if t is None:
            continue
        want_rank = 2 if name == "k_nope" and mla else 3
        if _tensor(name, t).dim() != want_rank or t.shape[0] != nnz or t.dtype != q_rope.dtype \
                or t.device != q_rope.device or (heads is not None and t.shape[1] != heads) \
                or (name == "k_nope" and not mla and t.shape[1] != k_rope.shape[1]):
            raise ValueError(f"{name} must be a {want_rank}-D {q_rope.dtype} tensor of {nnz} tokens "
                             f"and the heads of its rope part on {q_rope.device}, got "
                             f"{t.dtype} {tuple(t.shape)}")
    if q_nope is not None and k_nope is not None and q_nope.shape[-1] != k_nope.shape[-1]:
        raise ValueError(f"q_nope and k_nope must share no_rope_dim, got {q_nope.shape[-1]} and "
                         f"{k_nope.shape[-1]}")
    if cos_sin_cache is not None and isinstance(cos_sin_cache, torch.Tensor) \
            and cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] != rope_dim:
        raise ValueError(f"cos_sin_cache must be [max_pos, rope_dim={rope_dim}], got "
                         f"{tuple(cos_sin_cache.shape)}")
    given = [t.dtype for t in (q_rope_out, k_rope_out, q_nope_out, k_nope_out)
             if isinstance(t, torch.Tensor)]
    dtype = quantize_dtype or (given[0] if given else torch.float8_e4m3fn)
    if dtype not in _FP8:
        raise ValueError(f"quantize_dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    scale_q = _fp8_scale("quant_scale_q", quant_scale_q)
    scale_kv = _fp8_scale("quant_scale_kv", quant_scale_kv)
    q32, k32 = q_rope.float(), k3.float()  # fresh float32 copies, rotated in place
    q, k, pos, params = _cache_inputs(fn, pos_ids, q32, k32, rope_dim, cos_sin_cache, is_neox)
    _run(q, k, q, k, pos, params, cos_sin_cache, backend)
    k_rot = k32[:, 0] if mla else k32
    no_rope = (lambda like: like.new_empty((*like.shape[:-1], 0), dtype=dtype))  # noqa: E731
    return (_saturated(q32, scale_q, dtype, q_rope_out, "q_rope_out"),
            _saturated(k_rot, scale_kv, dtype, k_rope_out, "k_rope_out"),
            no_rope(q_rope) if q_nope is None else
            _saturated(q_nope.float(), scale_q, dtype, q_nope_out, "q_nope_out"),
            no_rope(k_rope) if k_nope is None else
            _saturated(k_nope.float(), scale_kv, dtype, k_nope_out, "k_nope_out"))


@flashinfer_api
def mla_rope_quantize_fp8(q_rope: torch.Tensor, k_rope: torch.Tensor,
                          q_nope: Optional[torch.Tensor], k_nope: Optional[torch.Tensor],
                          cos_sin_cache: torch.Tensor, pos_ids: torch.Tensor,
                          is_neox: bool = True, quantize_dtype: Optional[torch.dtype] = None,
                          quant_scale_q: float = 1.0, quant_scale_kv: float = 1.0,
                          q_rope_out: Optional[torch.Tensor] = None,
                          k_rope_out: Optional[torch.Tensor] = None,
                          q_nope_out: Optional[torch.Tensor] = None,
                          k_nope_out: Optional[torch.Tensor] = None,
                          enable_pdl: bool = False, *, backend: str = "auto"):
    """:func:`rope_quantize_fp8` (upstream's MLA spelling: ``k_rope [nnz, rope_dim]``, ``k_nope
    [nnz, kv_lora_rank]``, one latent KV head)."""
    return rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox,
                             quantize_dtype, quant_scale_q, quant_scale_kv, q_rope_out,
                             k_rope_out, q_nope_out, k_nope_out, enable_pdl, backend=backend)


@flashinfer_api
def rope_quantize_fp8_append_paged_kv_cache(
        q_rope: torch.Tensor, k_rope: torch.Tensor, q_nope: Optional[torch.Tensor],
        k_nope: Optional[torch.Tensor], v: Optional[torch.Tensor], cos_sin_cache: torch.Tensor,
        pos_ids: torch.Tensor, paged_kv_cache: Tuple[torch.Tensor, torch.Tensor],
        kv_indices: torch.Tensor, kv_indptr: torch.Tensor, batch_indices: torch.Tensor,
        positions: torch.Tensor, is_neox: bool = True, quantize_dtype: Optional[torch.dtype] = None,
        quant_scale_q: float = 1.0, quant_scale_kv: float = 1.0, page_size: int = 16,
        kv_layout: str = "NHD", q_rope_out: Optional[torch.Tensor] = None,
        q_nope_out: Optional[torch.Tensor] = None, enable_pdl: bool = False, *,
        backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope_quantize_fp8`, with the keys (and values) appended to a paged fp8 cache
    instead of returned, as upstream. Returns ``(q_rope_out, q_nope_out)``.

    * MLA (``k_rope [nnz, rope_dim]``, ``k_nope [nnz, kv_lora_rank]``, ``v`` None):
      ``paged_kv_cache = (ckv_cache [pages, page_size, kv_lora_rank], kpe_cache [pages,
      page_size, rope_dim])``; ``k_nope`` goes to ``ckv_cache``, the rotated ``k_rope`` to
      ``kpe_cache``.
    * GQA / MHA (``k_rope [nnz, H_k, rope_dim]``, ``k_nope [nnz, H_k, no_rope_dim]``, ``v [nnz,
      H_k, rope_dim + no_rope_dim]``): ``paged_kv_cache = (k_cache, v_cache)`` in ``kv_layout``;
      each key is ``[rotated k_rope, k_nope]``; values are scaled and cast as the keys.

    Token ``t`` goes to page ``kv_indices[kv_indptr[batch_indices[t]] + positions[t] //
    page_size]``, slot ``positions[t] % page_size`` (:func:`flashinfer.page.
    append_paged_kv_cache`, whose index rules apply), except that a token with a negative
    ``batch_indices`` entry is padding, as upstream: it is not appended (its query rows are
    still rotated and quantised). RoPE reads ``pos_ids``; the caches must already have the
    quantised dtype. ``enable_pdl`` is ignored.
    """
    from .attention.page import append_padded

    if not isinstance(paged_kv_cache, (tuple, list)) or len(paged_kv_cache) != 2:
        raise TypeError("paged_kv_cache must be a (k_cache, v_cache) or (ckv_cache, kpe_cache) pair")
    first, second = paged_kv_cache
    mla = isinstance(k_rope, torch.Tensor) and k_rope.dim() == 2
    if mla and v is not None:
        raise ValueError("the MLA form (2-D k_rope) appends no values: pass v=None")
    if not mla and not isinstance(v, torch.Tensor):
        raise ValueError("the GQA / MHA form (3-D k_rope) needs v [nnz, H_k, head_dim]")
    dtype = quantize_dtype or next((t.dtype for t in (q_rope_out, q_nope_out)
                                    if isinstance(t, torch.Tensor)), torch.float8_e4m3fn)
    for name, cache in (("paged_kv_cache[0]", first), ("paged_kv_cache[1]", second)):
        if not isinstance(cache, torch.Tensor) or cache.dtype != dtype:
            raise ValueError(f"{name} must be a {dtype} tensor (the quantised dtype), got "
                             f"{getattr(cache, 'dtype', type(cache).__name__)}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) \
            or page_size != first.shape[1 if mla or kv_layout == "NHD" else 2]:
        raise ValueError(f"page_size={page_size!r} differs from the cache's page size")
    q_out, k_rot, q_nope_q, k_nope_q = rope_quantize_fp8(
        q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, dtype, quant_scale_q,
        quant_scale_kv, q_rope_out, None, q_nope_out, None, backend=backend)
    if mla:
        keys, values = k_nope_q[:, None], k_rot[:, None]
        cache = (first.unsqueeze(2), second.unsqueeze(2))  # one latent head, NHD
        kv_layout = "NHD"
    else:
        keys = torch.cat([k_rot.view(torch.uint8), k_nope_q.view(torch.uint8)], -1).view(dtype)
        if not isinstance(v, torch.Tensor) or v.shape != keys.shape:
            raise ValueError(f"v must be [nnz, H_k, head_dim] = {tuple(keys.shape)}, got "
                             f"{tuple(getattr(v, 'shape', ()))}")
        values = _saturated(v.float(), _fp8_scale("quant_scale_kv", quant_scale_kv), dtype,
                            None, "v")
        cache = (first, second)
    append_padded(keys, values, batch_indices, positions, cache, kv_indices, kv_indptr,
                  kv_layout, backend)
    return q_out, q_nope_q


for _fn, _parts in (
    (apply_rope, ("Rotate a ragged batch; returns new ``(q_rope, k_rope)``.", _RAGGED_DOC)),
    (apply_rope_inplace, ("Rotate a ragged batch in place; returns None.", _RAGGED_DOC)),
    (apply_rope_pos_ids, ("Rotate tokens at given positions; returns new ``(q_rope, k_rope)``.",
                          _POS_DOC)),
    (apply_rope_pos_ids_inplace, ("Rotate tokens at given positions in place; returns None.",
                                  _POS_DOC)),
    (apply_llama31_rope, ("Llama 3.1 RoPE of a ragged batch; returns new ``(q_rope, k_rope)``.",
                          _RAGGED_DOC, _LLAMA_DOC)),
    (apply_llama31_rope_inplace, ("Llama 3.1 RoPE of a ragged batch in place; returns None.",
                                  _RAGGED_DOC, _LLAMA_DOC)),
    (apply_llama31_rope_pos_ids, ("Llama 3.1 RoPE at given positions; returns new "
                                  "``(q_rope, k_rope)``.", _POS_DOC, _LLAMA_DOC)),
    (apply_llama31_rope_pos_ids_inplace, ("Llama 3.1 RoPE at given positions in place; returns "
                                          "None.", _POS_DOC, _LLAMA_DOC)),
):
    _fn.__doc__ = "".join(_parts) + _QK_DOC
del _fn, _parts
