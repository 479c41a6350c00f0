"""Triton gated activations: launch configuration and the registered kernel.

Kernel signature and semantics: :mod:`flashinfer.activation`. The @triton.jit code lives in
``_activation_kernels.py`` and is imported on first use (this module must import without Triton).

Layout: the leading dims are flattened to rows (a view when the strides allow, else a copy); the
last dim of input and out must have stride 1, otherwise the tensor goes through a contiguous
buffer. Launch: grid ``(rows, cdiv(d, block))`` with ``block = min(next_pow2(d), MAX_BLOCK)``
and about ``ELEMS_PER_THREAD`` outputs per thread (1024-wide blocks get 4 warps: 8 values per
thread, one 16-byte load of bf16 from each half).
"""

from __future__ import annotations


import torch
from .launch import device_of, fast, pow2


#: widest column block one program handles.
MAX_BLOCK = 1024
#: target outputs per thread when choosing num_warps.
ELEMS_PER_THREAD = 8

_ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2}



def launch_config(d: int) -> tuple[int, int]:
    """``(block, num_warps)`` for an output row of ``d`` elements."""
    block = min(pow2(d), MAX_BLOCK)
    warps = min(8, max(1, block // (32 * ELEMS_PER_THREAD)))
    return block, warps


def _as_rows(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``t`` as ``[rows, width]`` with a unit-stride last dim: ``(view, True)`` when the strides
    allow it, else ``(contiguous copy, False)``."""
    if t.stride(-1) == 1:
        try:
            return t.view(-1, t.shape[-1]), True
        except RuntimeError:  # leading dims cannot be merged into one stride
            pass
    return t.reshape(-1, t.shape[-1]).contiguous(), False



def act_and_mul(input: torch.Tensor, out: torch.Tensor, activation: str) -> None:
    from . import _activation_kernels

    x, _ = _as_rows(input)
    y, y_is_view = _as_rows(out)
    n_rows, d = y.shape
    block, warps = launch_config(d)
    with device_of(x):
        fast(_activation_kernels.act_and_mul_kernel)[(n_rows, -(-d // block))](
            x, y, d, x.stride(0), y.stride(0),
            ACT=_ACT_CODES[activation], BLOCK=block, num_warps=warps,
        )
    if not y_is_view:
        out.copy_(y.view(out.shape))
