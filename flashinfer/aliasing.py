"""Memory overlap between tensors, for the checks that refuse destructive aliasing.

A kernel that writes one tensor while it still reads another corrupts the result when the two
share memory: ``fused_add_rmsnorm(x, residual=x)``, an ``out=`` that is a shifted view of the
input, a GEMM whose output is one of its operands. Public functions call
:func:`check_no_overlap` on such pairs and raise ``ValueError`` naming both arguments.

:func:`overlap` answers without reading any data: tensors on different storages never overlap;
on the same storage, disjoint byte ranges never overlap; two views with the same sizes and
strides (``k = kv[:, 0]``, ``v = kv[:, 1]``) overlap iff their offset difference is a
combination of their strides with coefficients inside the sizes (solved exactly); any other
pair whose ranges intersect is taken as overlapping (a conservative answer).
"""

from __future__ import annotations

import torch

__all__ = ["overlap", "check_no_overlap"]


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """``[first byte, one past the last byte)`` that ``t`` can touch (torch strides are >= 0)."""
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()


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


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share at least one memory element (see the module docstring)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    if a1 <= b0 or b1 <= a0:
        return False
    if (a.element_size() != b.element_size() or tuple(a.shape) != tuple(b.shape)
            or a.stride() != b.stride()):
        return True
    delta_bytes = b.data_ptr() - a.data_ptr()
    if delta_bytes % a.element_size():
        return True
    dims = sorted(((s, n) for n, s in zip(a.shape, a.stride()) if n > 1), reverse=True)
    return _reachable(abs(delta_bytes // a.element_size()), dims)


def check_no_overlap(function: str, written: str, out: torch.Tensor | None,
                     allow_same: bool = False, **read: torch.Tensor | None) -> None:
    """Raise ``ValueError`` if ``out`` (argument ``written`` of ``function``) shares memory with
    one of the ``read`` arguments. ``allow_same``: an ``out`` that is exactly the same view as a
    read tensor (same start, sizes, strides, dtype) is allowed, for kernels that read each
    element before they write it."""
    if out is None:
        return
    for name, t in read.items():
        if t is None or not isinstance(t, torch.Tensor):
            continue
        if allow_same and _same_view(out, t):
            continue
        if overlap(out, t):
            raise ValueError(
                f"{function}: {written} shares memory with {name}, which the kernel still reads "
                f"while it writes {written} (the result would be corrupted); pass separate "
                f"tensors" + (" (or exactly the same tensor, to work in place)" if allow_same else ""))


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            and a.stride() == b.stride())
