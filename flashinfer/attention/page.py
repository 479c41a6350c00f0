"""Paged KV-cache utilities (upstream module ``flashinfer.page``).

The paged cache is either one tensor ``[pages, 2, page_size, H_kv, D]`` (NHD) /
``[pages, 2, H_kv, page_size, D]`` (HND), with ``[:, 0]`` = K and ``[:, 1]`` = V, or a tuple
``(k_cache, v_cache)`` of ``[pages, page_size, H_kv, D]`` / ``[pages, H_kv, page_size, D]``.
A 4-D single tensor (3-D tuple members) means ``page_size = 1``. Nothing here synchronises
with the host.

``append_paged_kv_cache`` is dispatched as op ``append_paged_kv``. Every backend's kernel takes::

    kernel(append_key, append_value, batch_indices, positions, k_cache, v_cache,
           kv_indices, kv_indptr, page_size, kv_layout) -> None

* ``append_key``, ``append_value``: ``[nnz, H_kv, D]``, already in the cache dtype (any dtype,
  fp8 included: the kernel copies, it never converts);
* ``batch_indices``, ``positions``: ``[nnz]`` int32/int64, request and in-sequence position of
  each token; ``kv_indices``, ``kv_indptr``: the page table (int32/int64), appended tokens
  included;
* ``k_cache``, ``v_cache``: 4-D views, ``[pages, page_size, H_kv, D]`` (NHD) or
  ``[pages, H_kv, page_size, D]`` (HND), any strides, written in place;
* ``page_size``: int; ``kv_layout``: ``"NHD"`` or ``"HND"``.

Token ``t`` of request ``b`` at position ``p`` goes to page ``kv_indices[kv_indptr[b] + p //
page_size]``, slot ``p % page_size``.

Index arrays are data (the contract of :mod:`flashinfer.index_checks`): the rules of each
function are :mod:`flashinfer.attention.page_rules`'s. Arrays on the CPU are checked before anything is
written, and a bad entry raises ``ValueError`` naming the argument, the entry and what is
allowed. Arrays on a GPU are not read back: a kernel skips every bad entry (no write outside the
cache, none into another request's pages) and records the first one in the device's error
record, raised by ``flashinfer.check_errors()``, by the next batch-wrapper ``plan()``, or at the
call itself with ``FLASHINFER_CHECK_INDICES=1``.
"""

from __future__ import annotations

import numbers

import torch

from .. import dispatch, index_checks
from ..api_logging import flashinfer_api
from ..custom_op import custom_op
from ..dispatch import Problem
from . import page_rules
from .checks import check_kv_layout

_INDEX_DTYPES = (torch.int32, torch.int64)

__all__ = ["append_paged_kv_cache", "append_paged_mla_kv_cache", "get_batch_indices_positions",
           "get_seq_lens", "unpack_paged_kv_cache"]


def _page_dim(layout: str) -> int:
    return 1 if layout == "NHD" else 2  # page_size axis of a 4-D [pages, ..., D] view


def unpack_paged_kv_cache(paged_kv_cache, kv_layout: str = "NHD") -> tuple[torch.Tensor, torch.Tensor]:
    """``(k_cache, v_cache)`` 4-D views (no copy) of any accepted cache form."""
    layout = check_kv_layout(kv_layout)
    if isinstance(paged_kv_cache, torch.Tensor):
        t = paged_kv_cache
        if t.dim() == 4:  # [pages, 2, H, D]: page_size 1
            return t[:, 0].unsqueeze(_page_dim(layout)), t[:, 1].unsqueeze(_page_dim(layout))
        if t.dim() != 5 or t.shape[1] != 2:
            raise ValueError(f"paged_kv_cache as one tensor must be [pages, 2, page_size, H_kv, D] "
                             f"(NHD) or [pages, 2, H_kv, page_size, D] (HND), got shape {tuple(t.shape)}")
        return t.unbind(1)
    if isinstance(paged_kv_cache, (tuple, list)) and len(paged_kv_cache) == 2:
        k, v = paged_kv_cache
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise TypeError("paged_kv_cache tuple must hold two tensors (k_cache, v_cache)")
        if k.dim() != v.dim() or k.dim() not in (3, 4):
            raise ValueError(f"paged_kv_cache (k_cache, v_cache) must be 4-D (3-D for page_size 1), "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.dim() == 3:
            k, v = k.unsqueeze(_page_dim(layout)), v.unsqueeze(_page_dim(layout))
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(f"k_cache {tuple(k.shape)} and v_cache {tuple(v.shape)} must agree in "
                             "pages, page_size and heads")
        return k, v
    raise TypeError(f"paged_kv_cache must be a tensor or a (k_cache, v_cache) tuple, "
                    f"got {type(paged_kv_cache).__name__}")


def _index_tensor(name: str, t, device=None, length: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INDEX_DTYPES or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D int32 or int64 tensor, got {t.dtype} "
                         f"{tuple(t.shape)}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries, got {t.shape[0]}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other index arrays are on {device}")
    return t


def _count(name: str, value, low: int) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_floating_point:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if int(value) < low:
        raise ValueError(f"{name}={int(value)} must be >= {low}")
    return int(value)


def _out_buffer(name: str, buf, nnz: int, device) -> None:
    if buf is None:
        return
    _index_tensor(name, buf, device, nnz)


@flashinfer_api
def get_seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """kv length per request, int32 ``[B]``: ``clamp(pages - 1, min=0) * page_size +
    kv_last_page_len`` (upstream's formula), ``pages = kv_indptr[b + 1] - kv_indptr[b]``.

    ``kv_indptr`` int32/int64 ``[B + 1]`` non-decreasing; ``kv_last_page_len`` int32/int64 ``[B]``
    in ``[1, page_size]`` where the request has pages, ``[0, page_size]`` where it has none (as
    the batch wrappers' plan() accepts). Bad values: see the module docstring."""
    page_size = _count("page_size", page_size, 1)
    _index_tensor("kv_indptr", kv_indptr)
    if kv_indptr.shape[0] < 1:
        raise ValueError("kv_indptr must have at least one entry (batch_size + 1)")
    _index_tensor("kv_last_page_len", kv_last_page_len, kv_indptr.device, kv_indptr.shape[0] - 1)
    checks, lens = page_rules.seq_lens_checks(kv_indptr, kv_last_page_len, page_size)
    index_checks.enforce(checks, kv_indptr.device)
    return lens.to(torch.int32)


@flashinfer_api
def get_batch_indices_positions(append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int,
                                batch_indices: torch.Tensor | None = None,
                                positions: torch.Tensor | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR -> COO for appended tokens: token ``j`` of request ``b`` (``L_b = append_indptr[b + 1] -
    append_indptr[b]`` appended tokens, total length ``seq_lens[b]`` after the append) gets
    ``batch_indices = b`` and ``positions = seq_lens[b] - L_b + j``.

    ``append_indptr`` int32/int64 ``[B + 1]`` (``[0] == 0``, non-decreasing, ``[-1] == nnz``);
    ``seq_lens`` int32/int64 ``[B]``, each ``>= L_b``; ``nnz`` int. Returns int32 ``[nnz]``
    tensors, written into ``batch_indices`` / ``positions`` when given (int32/int64 ``[nnz]``).
    Bad values: see the module docstring (on a GPU a token outside every request is given the
    last request and a position computed from it; the fault is recorded)."""
    nnz = _count("nnz", nnz, 0)
    _index_tensor("append_indptr", append_indptr)
    if append_indptr.shape[0] < 1:
        raise ValueError("append_indptr must have at least one entry (batch_size + 1)")
    device = append_indptr.device
    _index_tensor("seq_lens", seq_lens, device, append_indptr.shape[0] - 1)
    _out_buffer("batch_indices", batch_indices, nnz, device)
    _out_buffer("positions", positions, nnz, device)
    checks, b, pos = page_rules.positions_checks(append_indptr, seq_lens, nnz)
    index_checks.enforce(checks, device)
    if batch_indices is None:
        batch_indices = b.to(torch.int32)
    else:
        batch_indices.copy_(b)
    if positions is None:
        positions = pos.to(torch.int32)
    else:
        positions.copy_(pos)
    return batch_indices, positions


@flashinfer_api
def append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor,
                          batch_indices: torch.Tensor, positions: torch.Tensor, paged_kv_cache,
                          kv_indices: torch.Tensor, kv_indptr: torch.Tensor,
                          kv_last_page_len: torch.Tensor, kv_layout: str = "NHD", *,
                          backend: str = "auto") -> None:
    """Scatter ``append_key/value [nnz, H_kv, D]`` into the cache: token ``t`` goes to page
    ``kv_indices[kv_indptr[batch_indices[t]] + positions[t] // page_size]``, slot
    ``positions[t] % page_size``. The page table must already include the appended tokens.
    ``append_key/value`` must have the cache dtype (quantise to fp8 before appending).
    ``kv_last_page_len`` is accepted for upstream compatibility and not read.

    Index values (module docstring): checked before the copy on the CPU; on a GPU each bad token
    is skipped and recorded (``flashinfer.check_errors()``); ``FLASHINFER_CHECK_INDICES=1``
    checks on the host there too.

    Registered as the custom op ``flashinfer::append_paged_kv_cache`` (the cache as a list of
    one tensor or of the (k, v) pair, mutated), so ``torch.compile(fullgraph=True)`` traces it."""
    _checked_append(append_key, append_value, batch_indices, positions, paged_kv_cache,
                    kv_indices, kv_indptr, kv_layout, backend, False)


@flashinfer_api
def append_paged_mla_kv_cache(append_ckv: torch.Tensor, append_kpe: torch.Tensor,
                              batch_indices: torch.Tensor, positions: torch.Tensor,
                              ckv_cache: torch.Tensor, kpe_cache: torch.Tensor,
                              kv_indices: torch.Tensor, kv_indptr: torch.Tensor,
                              kv_last_page_len: torch.Tensor) -> None:
    """Scatter MLA tokens into the latent caches (upstream's signature): ``append_ckv [nnz,
    ckv_dim]`` into ``ckv_cache [pages, page_size, ckv_dim]`` and ``append_kpe [nnz,
    kpe_dim]`` into ``kpe_cache [pages, page_size, kpe_dim]``, token ``t`` at page
    ``kv_indices[kv_indptr[batch_indices[t]] + positions[t] // page_size]``, slot ``positions[t]
    % page_size`` (in the cache dtype: no conversion). The append op with one latent head per
    cache, so its index rules and kernels apply; ``kv_last_page_len`` is not read."""
    for name, t in (("append_ckv", append_ckv), ("append_kpe", append_kpe)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D [nnz, dim] tensor, got "
                             f"{tuple(getattr(t, 'shape', ())) or type(t).__name__}")
    for name, t in (("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D [pages, page_size, dim] tensor, got "
                             f"{tuple(getattr(t, 'shape', ())) or type(t).__name__}")
    append_paged_kv_cache(append_ckv[:, None], append_kpe[:, None], batch_indices, positions,
                          (ckv_cache.unsqueeze(2), kpe_cache.unsqueeze(2)), kv_indices,
                          kv_indptr, kv_last_page_len, "NHD")


def append_padded(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
                  kv_indptr, kv_layout: str, backend: str) -> None:
    """:func:`append_paged_kv_cache` where a negative ``batch_indices`` entry marks a padding
    token, skipped (upstream's fused RoPE + quantise + append does so; its plain append does
    not): the form ``rope_quantize_fp8_append_paged_kv_cache`` calls."""
    _checked_append(append_key, append_value, batch_indices, positions, paged_kv_cache,
                    kv_indices, kv_indptr, kv_layout, backend, True)


def _checked_append(append_key, append_value, batch_indices, positions, paged_kv_cache,
                    kv_indices, kv_indptr, kv_layout: str, backend: str, skip_padding: bool) -> None:
    layout = check_kv_layout(kv_layout)
    _check_append(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
                  kv_indptr, layout)
    cache = [paged_kv_cache] if isinstance(paged_kv_cache, torch.Tensor) else list(paged_kv_cache)
    _append(append_key, append_value, batch_indices, positions, cache, kv_indices, kv_indptr,
            layout, backend, skip_padding)


def _check_append(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
                  kv_indptr, layout: str) -> None:
    """Argument checks (metadata only: they run on fake tensors while tracing too)."""
    k_cache, v_cache = unpack_paged_kv_cache(paged_kv_cache, layout)
    heads = k_cache.shape[2 if layout == "NHD" else 1]
    if v_cache.dtype != k_cache.dtype or v_cache.device != k_cache.device:
        raise ValueError(f"paged_kv_cache: v_cache ({v_cache.dtype}, {v_cache.device}) must match "
                         f"k_cache ({k_cache.dtype}, {k_cache.device})")
    for name, t, cache in (("append_key", append_key, k_cache), ("append_value", append_value, v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a [nnz, H_kv, D] tensor, got {tuple(getattr(t, 'shape', ()))}")
        if tuple(t.shape[1:]) != (heads, cache.shape[-1]) or t.shape[0] != append_key.shape[0]:
            raise ValueError(f"{name} shape {tuple(t.shape)} does not match the cache "
                             f"[nnz, H_kv={heads}, D={cache.shape[-1]}]")
        if t.device != cache.device:
            raise ValueError(f"{name} is on {t.device} but the cache is on {cache.device}")
        if t.dtype != cache.dtype:
            raise TypeError(f"{name} dtype {t.dtype} must equal the cache dtype {cache.dtype} "
                            "(the append copies; convert or quantise before appending)")
    for name, t in (("batch_indices", batch_indices), ("positions", positions),
                    ("kv_indices", kv_indices), ("kv_indptr", kv_indptr)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 or int64 tensor, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} "
                             f"{tuple(getattr(t, 'shape', ()))}")
        if t.device != k_cache.device:
            raise ValueError(f"{name} is on {t.device} but the cache is on {k_cache.device}")
    if kv_indptr.shape[0] < 1:
        raise ValueError("kv_indptr must have at least one entry (batch_size + 1)")
    nnz = append_key.shape[0]
    if batch_indices.shape[0] != nnz or positions.shape[0] != nnz:
        raise ValueError(f"batch_indices and positions must have nnz={nnz} entries, "
                         f"got {batch_indices.shape[0]} and {positions.shape[0]}")


def _append_fake(append_key, append_value, batch_indices, positions, cache, kv_indices, kv_indptr,
                 kv_layout, backend, skip_padding) -> None:
    return None


@custom_op("append_paged_kv_cache", mutates_args=("cache",), fake=_append_fake)
def _append(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
            positions: torch.Tensor, cache: list[torch.Tensor], kv_indices: torch.Tensor,
            kv_indptr: torch.Tensor, kv_layout: str, backend: str, skip_padding: bool) -> None:
    k_cache, v_cache = unpack_paged_kv_cache(cache[0] if len(cache) == 1 else tuple(cache), kv_layout)
    page_size = k_cache.shape[_page_dim(kv_layout)]
    heads = k_cache.shape[2 if kv_layout == "NHD" else 1]
    problem = Problem.make(
        "append_paged_kv", k_cache.device, dtypes={"kv": k_cache.dtype},
        shape={"num_kv_heads": heads, "head_dim": k_cache.shape[-1], "page_size": page_size,
               "num_tokens": dispatch.length_bucket(append_key.shape[0])},
        layout=kv_layout)
    if index_checks.host_check_wanted(k_cache.device):
        checks, _ = page_rules.append_checks(batch_indices, positions, kv_indices, kv_indptr,
                                              page_size, k_cache.shape[0], skip_padding)
        index_checks.raise_first(checks)
    decision = dispatch.decide(problem, backend)
    decision.kernel(append_key, append_value, batch_indices, positions, k_cache, v_cache,
                    kv_indices, kv_indptr, page_size, kv_layout, skip_padding)
