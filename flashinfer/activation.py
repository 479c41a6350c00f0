"""Gated activations (upstream module ``flashinfer.activation``): ``act(x[..., :d]) * x[..., d:]``.

The gate is the **first** half of the last dim, the linear ("up") part the second half. Public
functions keep upstream FlashInfer's names, argument order and defaults, plus our trailing
``backend="auto"``. ``enable_pdl`` (programmatic dependent launch) is accepted for compatibility
and ignored: no kernel here launches with PDL, and results do not depend on it.

Activations: ``silu(x) = x * sigmoid(x)``; ``gelu`` the exact erf form
``0.5 * x * (1 + erf(x / sqrt(2)))``; ``gelu_tanh`` the tanh approximation
``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``.

Input rule: upstream requires ``input.shape[-1] * itemsize % 16 == 0`` (its vector width). Our
kernels need only an even last dim, so that is all we require (an odd one is a ``ValueError``).

Canonical kernel signature (op ``"act_and_mul"``; every backend registers exactly this)::

    kernel(input, out, activation) -> None

* ``input``: ``[..., 2d]`` fp16/bf16/fp32, any strides; ``out``: ``[..., d]`` with the same
  leading shape, ``input``'s dtype, any strides.
* ``activation``: ``"silu"``, ``"gelu"`` or ``"gelu_tanh"`` (the Problem carries it as the
  feature of the same name, exactly one per call).
* computes in fp32 ``out = act(input[..., :d]) * input[..., d:]``, rounded once to the dtype.

Aliasing: ``out`` may not share memory with ``input`` (``ValueError``; not even the gate half
``input[..., :d]``: a kernel tiled over columns or rows would overwrite gate values another
program has yet to read), nor have a stride-0 dim. NaN / inf in ``input`` propagate through
the formula (NaN in, NaN out); nothing outside ``out`` is written.

Dispatch Problem: dtype ``input``, shape facts ``hidden_size`` = d (the output width) and
``num_rows`` = product of the leading dims, bucketed to a power of two.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import dispatch
from .aliasing import check_no_overlap, check_writable
from .api_logging import flashinfer_api
from .custom_op import custom_op
from .dispatch import Problem

__all__ = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_TEXT = "float16, bfloat16 or float32"


def _check(input, out, backend) -> torch.Tensor:
    """Validate the arguments; return ``out`` (allocated when ``None``)."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if input.dtype not in _DTYPES:
        raise TypeError(f"input dtype {input.dtype} is not supported; allowed: {_DTYPE_TEXT}")
    if input.dim() < 1:
        raise ValueError("input must have at least one dim [..., 2*d], got a 0-d tensor")
    width = input.shape[-1]
    if width == 0 or width % 2:
        raise ValueError(f"input last dim must be even and >= 2 (gate and up halves), got "
                         f"shape {tuple(input.shape)}")
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    shape = (*input.shape[:-1], width // 2)
    if out is None:
        return torch.empty(shape, dtype=input.dtype, device=input.device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out must have shape {shape} (input's leading dims, last dim halved), "
                         f"got {tuple(out.shape)}")
    if out.dtype != input.dtype:
        raise TypeError(f"out dtype {out.dtype} must equal input dtype {input.dtype}")
    if out.device != input.device:
        raise ValueError(f"out is on {out.device} but input is on {input.device}; "
                         f"both must be on the same device")
    return out


def _no_output(*args, **kwargs) -> None:
    """Fake impl: the op only writes into ``out``."""
    return None


@custom_op("act_and_mul", mutates_args=("out",), fake=_no_output)
def _act_and_mul_op(out: torch.Tensor, input: torch.Tensor, activation: str, backend: str) -> None:
    if out.numel() == 0:
        return
    function = f"{activation}_and_mul"
    check_writable(function, "out", out)
    check_no_overlap(function, "out", out, input=input)
    d = out.shape[-1]
    problem = Problem.make("act_and_mul", input.device, dtypes={"input": input.dtype},
                           shape={"hidden_size": d,
                                  "num_rows": dispatch.length_bucket(out.numel() // d)},
                           features=(activation,))
    dispatch.decide(problem, backend).kernel(input, out, activation)


def _act_and_mul(input, out, activation: str, backend: str) -> torch.Tensor:
    out = _check(input, out, backend)
    _act_and_mul_op(out, input, activation, backend)
    return out


@flashinfer_api
def silu_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None,
                 enable_pdl: Optional[bool] = None, *, backend: str = "auto") -> torch.Tensor:
    """``silu(input[..., :d]) * input[..., d:]``: ``[..., 2d]`` -> ``[..., d]`` (SwiGLU).

    ``input`` fp16/bf16/fp32 with an even last dim; ``out`` optional ``[..., d]`` buffer of the
    same dtype, written and returned. fp32 math. ``enable_pdl`` is ignored.
    """
    return _act_and_mul(input, out, "silu", backend)


@flashinfer_api
def gelu_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None,
                 enable_pdl: Optional[bool] = None, *, backend: str = "auto") -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` with the exact (erf) GELU (GeGLU).

    Shapes, dtypes and ``out`` as :func:`silu_and_mul`.
    """
    return _act_and_mul(input, out, "gelu", backend)


@flashinfer_api
def gelu_tanh_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None,
                      enable_pdl: Optional[bool] = None, *, backend: str = "auto") -> torch.Tensor:
    """``gelu_tanh(input[..., :d]) * input[..., d:]`` with the tanh-approximated GELU.

    Shapes, dtypes and ``out`` as :func:`silu_and_mul`.
    """
    return _act_and_mul(input, out, "gelu_tanh", backend)
