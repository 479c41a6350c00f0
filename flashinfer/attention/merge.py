"""Attention state merging (upstream's ``flashinfer.cascade`` functions, exported there).

An attention *state* of a query row and head is its output ``v [D]`` over some set of keys and
the base-2 log-sum-exp ``s`` of its scores over that set (what ``return_lse=True`` gives).
Attention over the union of disjoint key sets is the merge::

    s = log2(sum_i 2^s_i)            v = sum_i 2^(s_i - s) v_i

* ``merge_state(v_a, s_a, v_b, s_b) -> (v, s)``: ``v_* [rows, H, D]`` fp16/bf16/fp32 (both one
  dtype), ``s_* [rows, H]`` (any float dtype, read as fp32); ``v`` in ``v_a``'s dtype, ``s``
  fp32.
* ``merge_state_in_place(v, s, v_other, s_other, mask=None)``: ``v``, ``s`` (fp32) updated in
  place; ``mask`` (bool ``[rows]``, on the device) leaves the rows where it is False as they are
  (a fixed launch for CUDA graphs).
* ``merge_states(v, s) -> (v, s)``: ``v [rows, n, H, D]``, ``s [rows, n, H]`` -> ``[rows, H, D]``,
  ``[rows, H]``. :func:`flashinfer.triton.cascade.variable_length_merge_states` merges each
  row's ``indptr`` range of ``[total, H, D]`` states instead.

A (row, head) whose states all have ``s = -inf`` (no key seen) merges to ``v = 0``, ``s =
-inf``, never NaN; NaN or ``+inf`` in ``s`` gives NaN. Any head count and head dim (upstream's
CUDA kernel fails beyond 1,024 threads per block), any strides. Each function takes a trailing
``backend="auto"`` (``reference``, ``triton``) and is a registered custom op
(``torch.ops.flashinfer.merge_state``, ``merge_state_in_place``, ``merge_states``).

Canonical kernel signatures (op ``merge_state`` / ``merge_states``)::

    merge_state(v_a, s_a, v_b, s_b, v_out, s_out, mask) -> None     # v_out / s_out may be v_a / s_a
    merge_states(v, s, indptr, v_out, s_out) -> None                # indptr None: v [rows, n, H, D]

with ``s_*`` fp32. Dispatch Problem: dtypes ``v`` and ``s``; shape facts ``num_heads``,
``head_dim``, ``num_rows`` (and ``num_states``) bucketed; features ``in_place``, ``mask``,
``variable_length``.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import dispatch
from ..api_logging import flashinfer_api
from ..custom_op import custom_op
from ..dispatch import Problem

__all__ = ["merge_state", "merge_state_in_place", "merge_states", "variable_length_merge_states"]

_V_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _values(name: str, v, rank: int) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(v).__name__}")
    if v.dtype not in _V_DTYPES:
        raise TypeError(f"{name} dtype {v.dtype} is not supported; allowed: float16, bfloat16, "
                        f"float32")
    if v.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got shape {tuple(v.shape)}")
    return v


def _lse(name: str, s, want: tuple, device: torch.device, fp32_only: bool = False) -> torch.Tensor:
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(s).__name__}")
    if not s.is_floating_point() or (fp32_only and s.dtype != torch.float32):
        raise TypeError(f"{name} must be {'float32' if fp32_only else 'a float tensor'}, got "
                        f"{s.dtype}")
    if tuple(s.shape) != want:
        raise ValueError(f"{name} must have shape {list(want)}, got {tuple(s.shape)}")
    if s.device != device:
        raise ValueError(f"{name} is on {s.device}, the states on {device}")
    return s


def _pair(v_a, v_b, names: tuple[str, str]) -> None:
    if v_b.shape != v_a.shape or v_b.dtype != v_a.dtype or v_b.device != v_a.device:
        raise ValueError(f"{names[1]} must match {names[0]} (shape {tuple(v_a.shape)}, "
                         f"{v_a.dtype} on {v_a.device}), got {tuple(v_b.shape)} {v_b.dtype} on "
                         f"{v_b.device}")


def _decide(op: str, v: torch.Tensor, rows: int, heads: int, head_dim: int, backend: str,
            features: tuple[str, ...] = (), num_states: int | None = None) -> dispatch.Decision:
    shape = {"num_heads": heads, "head_dim": head_dim, "num_rows": dispatch.length_bucket(rows)}
    if num_states is not None:
        shape["num_states"] = dispatch.length_bucket(num_states)
    key = (op, v.device, v.dtype, heads, head_dim, shape["num_rows"], shape.get("num_states"),
           features)

    def problem() -> Problem:
        return Problem.make(op, v.device, dtypes={"v": v.dtype, "s": torch.float32},
                            shape=shape, features=set(features))

    return dispatch.decide_keyed(key, problem, backend)


def _merge_state_fake(v_a, s_a, v_b, s_b, backend):
    return torch.empty_like(v_a), torch.empty(s_a.shape, dtype=torch.float32, device=s_a.device)


@custom_op("merge_state", fake=_merge_state_fake)
def _merge_state_op(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                    backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    _values("v_a", v_a, 3)
    _values("v_b", v_b, 3)
    _pair(v_a, v_b, ("v_a", "v_b"))
    rows, heads, head_dim = v_a.shape
    s_a = _lse("s_a", s_a, (rows, heads), v_a.device).float()
    s_b = _lse("s_b", s_b, (rows, heads), v_a.device).float()
    v_out = torch.empty_like(v_a)
    s_out = torch.empty((rows, heads), dtype=torch.float32, device=v_a.device)
    if v_a.numel() or s_out.numel():
        _decide("merge_state", v_a, rows, heads, head_dim, backend).kernel(
            v_a, s_a, v_b, s_b, v_out, s_out, None)
    return v_out, s_out


@custom_op("merge_state_in_place", mutates_args=("v", "s"), fake=lambda *a, **k: None)
def _merge_state_in_place_op(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor,
                             s_other: torch.Tensor, mask: Optional[torch.Tensor],
                             backend: str) -> None:
    _values("v", v, 3)
    _values("v_other", v_other, 3)
    _pair(v, v_other, ("v", "v_other"))
    rows, heads, head_dim = v.shape
    _lse("s", s, (rows, heads), v.device, fp32_only=True)
    s_other = _lse("s_other", s_other, (rows, heads), v.device).float()
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool \
                or tuple(mask.shape) != (rows,) or mask.device != v.device:
            raise ValueError(f"mask must be a bool tensor of shape [{rows}] on {v.device}, got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)} "
                             f"{tuple(getattr(mask, 'shape', ()))}")
    if rows == 0 or heads == 0:
        return
    features = ("in_place",) + (("mask",) if mask is not None else ())
    _decide("merge_state", v, rows, heads, head_dim, backend, features).kernel(
        v, s, v_other, s_other, v, s, mask)


def _merge_states_fake(v, s, indptr, backend):
    rows = v.shape[0] if indptr is None else indptr.shape[0] - 1
    return (v.new_empty((rows,) + tuple(v.shape[-2:])),
            torch.empty((rows, v.shape[-2]), dtype=torch.float32, device=v.device))


@custom_op("merge_states", fake=_merge_states_fake)
def _merge_states_op(v: torch.Tensor, s: torch.Tensor, indptr: Optional[torch.Tensor],
                     backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if indptr is None:
        _values("v", v, 4)
        rows, num_states, heads, head_dim = v.shape
        s = _lse("s", s, (rows, num_states, heads), v.device).float()
    else:
        _values("v", v, 3)
        total, heads, head_dim = v.shape
        s = _lse("s", s, (total, heads), v.device).float()
        indptr = _indptr(indptr, total, v.device)
        rows, num_states = indptr.shape[0] - 1, max(1, total // max(1, indptr.shape[0] - 1))
    v_out = v.new_empty((rows, heads, head_dim))
    s_out = torch.empty((rows, heads), dtype=torch.float32, device=v.device)
    if rows and heads:
        features = ("variable_length",) if indptr is not None else ()
        _decide("merge_states", v, rows, heads, head_dim, backend, features,
                num_states=num_states).kernel(v, s, indptr, v_out, s_out)
    return v_out, s_out


def _indptr(indptr, total: int, device: torch.device) -> torch.Tensor:
    """``indptr`` as int32 on ``device``, checked on a host copy: 0 first, non-decreasing,
    ending at ``total`` (the states' count). One synchronisation when it lives on a GPU."""
    if not isinstance(indptr, torch.Tensor) or indptr.dim() != 1 or indptr.shape[0] < 1 \
            or indptr.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indptr must be a 1-D int32/int64 tensor of rows + 1 offsets, got "
                         f"{getattr(indptr, 'dtype', type(indptr).__name__)} "
                         f"{tuple(getattr(indptr, 'shape', ()))}")
    host = indptr.cpu()
    if int(host[0]) != 0 or int(host[-1]) != total or bool((host[1:] < host[:-1]).any()):
        raise ValueError(f"indptr must start at 0, never decrease and end at {total} (the "
                         f"states given), got {host.tolist()[:16]}")
    return indptr.to(device=device, dtype=torch.int32)


@flashinfer_api
def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two states: ``v_* [rows, H, D]`` fp16/bf16/fp32, ``s_* [rows, H]`` base-2 lse ->
    ``(v [rows, H, D] in v_a's dtype, s [rows, H] float32)``."""
    return _merge_state_op(v_a, s_a, v_b, s_b, backend)


@flashinfer_api
def merge_state_in_place(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor,
                         s_other: torch.Tensor, mask: Optional[torch.Tensor] = None,
                         backend: str = "auto") -> None:
    """Merge ``(v_other, s_other)`` into ``v [rows, H, D]``, ``s [rows, H]`` (float32) in place;
    ``mask`` (bool ``[rows]``): only the rows where it is True."""
    _merge_state_in_place_op(v, s, v_other, s_other, mask, backend)


@flashinfer_api
def merge_states(v: torch.Tensor, s: torch.Tensor,
                 backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``n`` states per row: ``v [rows, n, H, D]``, ``s [rows, n, H]`` -> ``(v [rows, H,
    D], s [rows, H] float32)``."""
    return _merge_states_op(v, s, None, backend)


def variable_length_merge_states(v: torch.Tensor, s: torch.Tensor, indptr: torch.Tensor,
                                 backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Merge each row's states ``indptr[r]:indptr[r + 1]`` of ``v [total, H, D]``, ``s [total,
    H]`` -> ``(v [rows, H, D], s [rows, H] float32)``; an empty range gives ``v = 0``, ``s =
    -inf``."""
    return _merge_states_op(v, s, indptr, backend)
