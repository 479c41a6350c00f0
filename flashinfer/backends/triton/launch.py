"""Launch arithmetic every Triton kernel function here shares."""

from __future__ import annotations

import contextlib

import torch


def pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``): block sizes."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b``: grid sizes."""
    return -(-a // b)


def device_of(t: torch.Tensor):
    """A context that makes ``t``'s GPU current for a launch (Triton launches on the current
    device); a no-op on the CPU (the interpreter)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()
