"""Memory overlap between tensors, for the checks that refuse destructive aliasing.

A kernel that writes one tensor while it still reads another corrupts the result when the two
share memory: ``fused_add_rmsnorm(x, residual=x)``, an ``out=`` that is a shifted view of the
input, a GEMM whose output is one of its operands. Public functions call
:func:`check_no_overlap` on such pairs and raise ``ValueError`` naming both arguments.

:func:`overlap` answers without reading any data:

* tensors on different storages (or devices) never overlap: two pointer compares, the whole
  cost of a check on the hot path, where arguments are separate allocations;
* on the same storage, disjoint byte ranges never overlap;
* views whose strides *nest* (sorted by stride, each stride at least the byte extent of the
  dims below it: any row-major tensor, its slices, transposes and splits, e.g. the query and
  key column blocks split from one packed ``qkv`` buffer) are compared exactly, one dim at a
  time: which rows of the outer dim can meet, then the same question inside those rows;
* two views with the same sizes and strides (``k = kv[:, 0]``, ``v = kv[:, 1]``) overlap iff
  their offset difference is a combination of their strides with coefficients inside the
  sizes (solved exactly);
* any other pair whose ranges intersect is taken as overlapping (a conservative answer).

:func:`internal_overlap` says whether a tensor to be written has two elements at one address
(a dim of size > 1 with stride 0, as ``expand`` makes); :func:`check_writable` refuses it.
"""

from __future__ import annotations

import torch

__all__ = ["overlap", "internal_overlap", "check_no_overlap", "check_writable", "same_view"]


def _reachable(delta: int, dims: list[tuple[int, int]]) -> bool:
    """Whether ``delta = sum(c_i * stride_i)`` with ``|c_i| < size_i`` (dims sorted by stride,
    largest first; a depth-first search trying the two nearest coefficients at each level)."""
    if not dims:
        return delta == 0
    (stride, size), rest = dims[0], dims[1:]
    if stride == 0:
        return _reachable(delta, rest)
    base = delta // stride
    for c in (base, base + 1):
        if abs(c) < size and _reachable(delta - c * stride, rest):
            return True
    return False


def _layout(t: torch.Tensor) -> tuple[list[tuple[int, int]], int]:
    """``(dims, span)``: ``(stride in bytes, size)`` of the dims that move (size > 1, stride >
    0), largest stride first, and the bytes from ``t``'s first to one past its last byte."""
    e = t.element_size()
    dims, extent = [], e
    for n, s in zip(t.shape, t.stride()):
        if n > 1 and s > 0:
            dims.append((s * e, n))
            extent += (n - 1) * s * e
    dims.sort(reverse=True)
    return dims, extent


def _nested_hit(da: list, ia: int, db: list, ib: int, delta: int) -> bool | None:
    """Whether ``A`` (dims ``da``, spanning ``ia`` bytes from offset 0) and ``B`` (``db``,
    spanning ``ib`` bytes from byte offset ``delta``) share a byte; ``None`` when the
    strides do not nest (no exact answer here). Splits off the largest stride ``S``: a row of
    each tensor lies within ``S`` bytes, so only rows ``ra - rb = k`` with ``k * S`` near
    ``delta`` can meet, and none can when the two rows' windows modulo ``S`` are disjoint."""
    if delta >= ia or -delta >= ib:
        return False
    if not da and not db:
        return True
    stride = max(da[0][0] if da else 0, db[0][0] if db else 0)
    if da and da[0][0] == stride:
        na, ra = da[0][1], da[1:]
        ia -= (na - 1) * stride
    else:
        na, ra = 1, da
    if db and db[0][0] == stride:
        nb, rb = db[0][1], db[1:]
        ib -= (nb - 1) * stride
    else:
        nb, rb = 1, db
    if ia > stride or ib > stride:
        return None
    shift = delta % stride
    if shift >= ia and shift + ib <= stride:
        return False  # b's window in a row, [shift, shift + ib), misses a's window [0, ia)
    # a byte of row ra (offset ra*S + x, 0 <= x < ia) meets one of row rb (delta + rb*S + y,
    # 0 <= y < ib) only if (ra - rb) * S lies in (delta - ia, delta + ib)
    unknown = False
    for k in range(max((delta - ia) // stride, 1 - nb), min((delta + ib) // stride, na - 1) + 1):
        hit = _nested_hit(ra, ia, rb, ib, delta - k * stride)
        if hit:
            return True
        unknown = unknown or hit is None
    return None if unknown else False


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share at least one memory element (see the module docstring)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device or a.device.type == "meta":
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    da, ia = _layout(a)
    db, ib = _layout(b)
    delta = b.data_ptr() - a.data_ptr()
    nested = _nested_hit(da, ia, db, ib, delta)
    if nested is not None:
        return nested
    if (a.element_size() != b.element_size() or tuple(a.shape) != tuple(b.shape)
            or a.stride() != b.stride()):
        return True
    if delta % a.element_size():
        return True
    dims = sorted(((s, n) for n, s in zip(a.shape, a.stride()) if n > 1), reverse=True)
    return _reachable(abs(delta // a.element_size()), dims)


def internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share an address through a stride-0 dim of size > 1 (the
    case ``expand`` and broadcasting views make; other self-overlapping strides are not looked
    for)."""
    strides = t.stride()
    return 0 in strides and any(s == 0 and n > 1 for n, s in zip(t.shape, strides))


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are exactly the same view: same device, start, dtype, sizes and
    strides."""
    return (a.data_ptr() == b.data_ptr() and a.device == b.device and a.dtype == b.dtype
            and tuple(a.shape) == tuple(b.shape) and a.stride() == b.stride())


def in_storage_of(out: torch.Tensor, *read: torch.Tensor | None) -> bool:
    """Whether one of the ``read`` tensors (``None`` entries skipped) lives in ``out``'s
    storage: the cheap first step of :func:`check_no_overlap`, for a hot path that calls it
    only then."""
    base = out.untyped_storage().data_ptr()
    for t in read:
        if t is not None and t.untyped_storage().data_ptr() == base:
            return True
    return False


def check_no_overlap(function: str, written: str, out: torch.Tensor | None,
                     allow_same: bool = False, **read: torch.Tensor | None) -> None:
    """Raise ``ValueError`` if ``out`` (argument ``written`` of ``function``) shares memory with
    one of the ``read`` arguments (``None`` entries are skipped). ``allow_same``: an ``out``
    that is exactly the same view as a read tensor (:func:`same_view`) is allowed, for kernels
    that read each element before they write it. Costs two pointer reads per pair when the
    storages differ."""
    if out is None:
        return
    base = None
    for name, t in read.items():
        if not isinstance(t, torch.Tensor):
            continue
        if base is None:
            base = out.untyped_storage().data_ptr()
        if t.untyped_storage().data_ptr() != base:
            continue
        if allow_same and same_view(out, t):
            continue
        if overlap(out, t):
            same = " (or exactly the same tensor, to work in place)" if allow_same else ""
            raise ValueError(
                f"{function}: {written} shares memory with {name}, which the kernel still reads "
                f"while it writes {written} (the result would be corrupted); pass separate "
                f"tensors{same}")


def check_writable(function: str, name: str, t: torch.Tensor) -> None:
    """Raise ``ValueError`` if the tensor ``t`` that ``function`` writes (argument ``name``) has
    two elements at one address (:func:`internal_overlap`): the writes would race."""
    if internal_overlap(t) and t.numel() > 1:
        raise ValueError(f"{function}: {name} has a dim of stride 0 (an expanded / broadcast "
                         f"view, shape {tuple(t.shape)}, strides {t.stride()}): several of its "
                         f"elements share one address and the kernel writes each of them; pass "
                         f"a tensor with its own memory per element")
