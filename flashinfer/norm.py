"""Normalisation ops (upstream module ``flashinfer.norm``): RMSNorm, its fused-residual and Gemma
forms, and LayerNorm.

Public functions keep upstream FlashInfer's names, argument order and defaults, plus our trailing
``backend="auto"``. ``enable_pdl`` (programmatic dependent launch) is accepted for compatibility
and ignored: no kernel here launches with PDL, and results do not depend on it.

Canonical kernel signatures (every backend registers exactly these)
--------------------------------------------------------------------
``rmsnorm`` (op ``"rmsnorm"``)::

    kernel(input, weight, out, residual, eps, weight_bias) -> None

* ``input``: ``[B, H]`` (a 2-D call, as given: no view is made on the hot path) or
  ``[B, N, H]`` (a per-head call ``[tokens, heads, head_dim]``) fp16/bf16/fp32; any strides.
* ``weight``: ``[H]`` fp16/bf16/fp32. The scale applied is ``weight + weight_bias`` (``0.0``,
  or ``1.0`` for the Gemma form).
* ``out``: ``input``'s shape and dtype, any strides; it may be ``input`` itself (exactly
  the same view: every kernel reads a row before it writes that row, and no program reads
  another program's rows), never another view of ``input``'s memory nor of ``weight``'s.
* ``residual``: ``None``, or ``input``'s shape and dtype (fused add). Then the kernel
  first stores ``residual <- round(input + residual)`` (sum in fp32, rounded to the dtype) and
  normalises that rounded sum.
* computes, per row, in fp32: ``out = v * rsqrt(mean(v^2) + eps) * (weight + weight_bias)``,
  ``v = input`` (or the new residual), rounded once to ``out``'s dtype.

Rounding of the fused sum: upstream's CUDA and CuTe-DSL kernels keep the unrounded fp32 sum for
the normalisation (only the stored residual is rounded); upstream's own Gemma test reference
rounds first. We normalise the rounded sum, what the stored residual holds, so every path (the
single-block and the looped Triton kernel, the reference) computes the same thing. The two
choices differ by at most half an ulp of the input dtype per element before normalisation.

``layernorm`` (op ``"layernorm"``)::

    kernel(input, gamma, beta, out, eps) -> None

* ``input`` ``[B, H]`` fp16/bf16/fp32, any strides; ``gamma``, ``beta`` ``[H]`` (upstream:
  fp32; fp16/bf16 accepted); ``out`` ``[B, H]`` in ``input``'s dtype.
* computes, per row, in fp32: ``out = (x - mean) * rsqrt(var + eps) * gamma + beta`` with the
  biased variance ``mean((x - mean)^2)``.

Destructive aliasing (:mod:`flashinfer.aliasing`) raises ``ValueError`` before any kernel runs:
``rmsnorm`` / ``gemma_rmsnorm``: ``out`` sharing memory with ``input`` (other than being exactly
``input``) or with ``weight``; ``fused_add_rmsnorm`` / ``gemma_fused_add_rmsnorm``: ``residual``
sharing memory with ``input`` (``residual=input`` would destroy the residual stream: the sum is
stored, then overwritten by the normalised output) or either of them with ``weight`` (other
rows would read a weight already overwritten); a written tensor with a stride-0 dim (several
elements at one address). ``layernorm`` writes a fresh tensor. The check costs two pointer
reads per pair of separate allocations.

Values: ``eps`` must be a finite number >= 0 (NaN, inf, negative: ``ValueError``). NaN or inf
in ``input``, ``residual`` or ``weight`` propagate (NaN in, NaN out); nothing is written
outside ``out`` (and ``residual``).

Dispatch Problem: dtypes ``input`` and ``weight`` (``gamma`` for layernorm), shape facts
``hidden_size`` = H and ``num_rows`` = B*N bucketed to a power of two; rmsnorm features
``fused_add``, ``gemma_weight``, ``per_head`` (3-D input).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import dispatch
from .aliasing import check_no_overlap, check_writable
from .api_logging import flashinfer_api
from .checked_calls import CheckedCalls, tensor_fact
from .custom_op import custom_op
from .dispatch import Problem

__all__ = ["rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "layernorm",
           "rmsnorm_quant", "fused_add_rmsnorm_quant", "layernorm_quant"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_TEXT = "float16, bfloat16 or float32"


# --------------------------------------------------------------------------------------------
# validation (runs on real and fake tensors alike: metadata only)


def _tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} dtype {t.dtype} is not supported; allowed: {_DTYPE_TEXT}")
    return t


def _same_device(name: str, t: torch.Tensor, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but input is on {ref.device}; "
                         f"all tensors must be on the same device")


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not 0 <= eps < math.inf:  # also rejects NaN; plain comparisons trace under torch.compile
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _check_rows(input, ranks: tuple[int, ...], what: str) -> torch.Tensor:
    _tensor("input", input)
    if input.dim() not in ranks:
        raise ValueError(f"input must be {what}, got shape {tuple(input.shape)}")
    if input.shape[-1] == 0:
        raise ValueError(f"input hidden size (last dim) must be >= 1, got shape {tuple(input.shape)}")
    return input


def _check_vector(name: str, t, input: torch.Tensor) -> None:
    _tensor(name, t)
    hidden = input.shape[-1]
    if t.dim() != 1 or t.shape[0] != hidden:
        raise ValueError(f"{name} must have shape ({hidden},) to match input's last dim, "
                         f"got {tuple(t.shape)}")
    _same_device(name, t, input)


def _check_like(name: str, t, input: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != input.shape:
        raise ValueError(f"{name} must have input's shape {tuple(input.shape)}, got {tuple(t.shape)}")
    if t.dtype != input.dtype:
        raise TypeError(f"{name} dtype {t.dtype} must equal input dtype {input.dtype}")
    _same_device(name, t, input)


def _check_backend(backend) -> str:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    return backend


def _check_rmsnorm_args(input, weight, eps, backend) -> float:
    _check_rows(input, (2, 3), "2-D [batch, hidden] or 3-D [batch, heads, head_dim]")
    _check_vector("weight", weight, input)
    _check_backend(backend)
    return _check_eps(eps)


# --------------------------------------------------------------------------------------------
# dispatch + kernel call (inside the custom ops: opaque to torch.compile)


def _rmsnorm_decision(input: torch.Tensor, weight: torch.Tensor, weight_bias: float,
                      fused_add: bool, backend: str) -> dispatch.Decision:
    return dispatch.decide_keyed(*_rmsnorm_facts(input, weight, weight_bias, fused_add), backend)


def _rmsnorm_facts(input: torch.Tensor, weight: torch.Tensor, weight_bias: float,
                   fused_add: bool) -> tuple:
    """``(key, make_problem)`` of op ``rmsnorm`` (:func:`flashinfer.dispatch.decide_keyed`)."""
    hidden = input.shape[-1]
    rows = dispatch.length_bucket(input.numel() // hidden)
    per_head, gemma = input.dim() == 3, weight_bias != 0.0

    def problem() -> Problem:
        features = [name for name, used in (("fused_add", fused_add), ("gemma_weight", gemma),
                                            ("per_head", per_head)) if used]
        return Problem.make("rmsnorm", input.device,
                            dtypes={"input": input.dtype, "weight": weight.dtype},
                            shape={"hidden_size": hidden, "num_rows": rows}, features=features)

    key = ("rmsnorm", input.device, input.dtype, weight.dtype, hidden, rows, fused_add, gemma,
           per_head)
    return key, problem


def _check_out_aliasing(function: str, out: torch.Tensor, input: torch.Tensor,
                        weight: torch.Tensor) -> None:
    """``out`` may be ``input`` itself, nothing else sharing memory with ``input`` or
    ``weight``, and no stride-0 dim (module docstring)."""
    check_writable(function, "out", out)
    base = out.untyped_storage().data_ptr()
    if (base == input.untyped_storage().data_ptr()
            or base == weight.untyped_storage().data_ptr()):  # else: separate allocations
        check_no_overlap(function, "out", out, True, input=input)
        check_no_overlap(function, "out", out, weight=weight)


def _no_output(*args, **kwargs) -> None:
    """Fake impl of the ops below: they only write into tensors they were given."""
    return None


@custom_op("rmsnorm", mutates_args=("out",), fake=_no_output)
def _rmsnorm_op(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float,
                weight_bias: float, backend: str) -> None:
    if input.numel() == 0:
        return
    _check_out_aliasing("gemma_rmsnorm" if weight_bias else "rmsnorm", out, input, weight)
    decision = _rmsnorm_decision(input, weight, weight_bias, False, backend)
    decision.kernel(input, weight, out, None, eps, weight_bias)


@custom_op("fused_add_rmsnorm", mutates_args=("input", "residual"), fake=_no_output)
def _fused_add_rmsnorm_op(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float, weight_bias: float, backend: str) -> None:
    if input.numel() == 0:
        return
    function = "gemma_fused_add_rmsnorm" if weight_bias else "fused_add_rmsnorm"
    check_writable(function, "input", input)
    check_writable(function, "residual", residual)
    check_no_overlap(function, "residual", residual, input=input, weight=weight)
    check_no_overlap(function, "input", input, weight=weight)
    decision = _rmsnorm_decision(input, weight, weight_bias, True, backend)
    decision.kernel(input, weight, input, residual, eps, weight_bias)


@custom_op("layernorm", mutates_args=("out",), fake=_no_output)
def _layernorm_op(out: torch.Tensor, input: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor,
                  eps: float, backend: str) -> None:
    if input.numel() == 0:
        return
    problem = Problem.make("layernorm", input.device,
                           dtypes={"input": input.dtype, "weight": gemma.dtype},
                           shape={"hidden_size": input.shape[-1],
                                  "num_rows": dispatch.length_bucket(input.shape[0])})
    dispatch.decide(problem, backend).kernel(input, gemma, beta, out, eps)


# --------------------------------------------------------------------------------------------
# public API


#: eager rmsnorm / gemma_rmsnorm calls that passed every check -> (eps as a float, the call's
#: KeyedDecision); ``out``'s aliasing with the inputs is checked per call
_CHECKED_NORMS = CheckedCalls()


def _norm_signature(input, weight, eps, out, weight_bias, backend) -> tuple | None:
    # (the hot path of every layer's norm: one tensor_fact per tensor, unrolled)
    if (not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor)
            or torch.compiler.is_compiling()):
        return None
    if out is None:
        out_facts = None
    elif isinstance(out, torch.Tensor):
        out_facts = tensor_fact(out)
    else:
        return None
    return (tensor_fact(input), tensor_fact(weight), out_facts, type(eps), eps, weight_bias,
            type(backend), backend)


def _rmsnorm(input, weight, eps, out, weight_bias: float, backend: str) -> torch.Tensor:
    signature = _norm_signature(input, weight, eps, out, weight_bias, backend)
    hit = _CHECKED_NORMS.get(signature)
    if hit is not None:  # the steady state: checked, dispatch facts kept
        eps, choice = hit
        if out is None:  # (a stored signature has a non-empty input)
            out = torch.empty_like(input)
        else:
            _check_out_aliasing("gemma_rmsnorm" if weight_bias else "rmsnorm", out, input, weight)
        choice.get(backend).kernel(input, weight, out, None, eps, weight_bias)
        return out
    eps = _check_rmsnorm_args(input, weight, eps, backend)
    if out is None:
        out = torch.empty_like(input)
    else:
        _check_like("out", out, input)
    _rmsnorm_op(out, input, weight, eps, weight_bias, backend)
    if input.numel():
        _CHECKED_NORMS.put(signature, (eps, dispatch.KeyedDecision(
            *_rmsnorm_facts(input, weight, weight_bias, False))))
    return out


def _fused_add_rmsnorm(input, residual, weight, eps, weight_bias: float, backend: str) -> None:
    eps = _check_rmsnorm_args(input, weight, eps, backend)
    _check_like("residual", residual, input)
    _fused_add_rmsnorm_op(input, residual, weight, eps, weight_bias, backend)


@flashinfer_api
def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
            out: Optional[torch.Tensor] = None, enable_pdl: Optional[bool] = None, *,
            backend: str = "auto") -> torch.Tensor:
    """Root-mean-square normalisation: ``out = input * rsqrt(mean(input^2) + eps) * weight``.

    ``input``: ``[batch, hidden]``, or ``[batch, heads, head_dim]`` to normalise each head
    (QK-norm), fp16/bf16/fp32, any strides. ``weight``: ``[hidden]`` fp16/bf16/fp32.
    ``out``: optional ``input``-shaped buffer of ``input``'s dtype, written and returned; it may
    be ``input`` itself (in place), but no other view sharing memory with ``input`` or
    ``weight`` (``ValueError``).
    Statistics and products in fp32. ``enable_pdl`` is ignored (see the module docstring).
    """
    return _rmsnorm(input, weight, eps, out, 0.0, backend)


@flashinfer_api
def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                  out: Optional[torch.Tensor] = None, enable_pdl: Optional[bool] = None, *,
                  backend: str = "auto") -> torch.Tensor:
    """Gemma-style RMSNorm: as :func:`rmsnorm` with the scale ``weight + 1``."""
    return _rmsnorm(input, weight, eps, out, 1.0, backend)


@flashinfer_api
def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6, enable_pdl: Optional[bool] = None, *,
                      backend: str = "auto") -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual) * weight``.

    ``input``, ``residual``: same shape (``[batch, hidden]``; ``[batch, heads, head_dim]`` is
    also accepted) and dtype (fp16/bf16/fp32). The sum is taken in fp32 and rounded to the dtype
    when stored in ``residual``; the rounded sum is what gets normalised (module docstring).
    ``input`` and ``residual`` must not share memory with each other or with ``weight``
    (``ValueError``: ``residual=input`` would destroy the residual stream). Returns ``None``.
    ``enable_pdl`` is ignored.
    """
    _fused_add_rmsnorm(input, residual, weight, eps, 0.0, backend)


@flashinfer_api
def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float = 1e-6, enable_pdl: Optional[bool] = None, *,
                            backend: str = "auto") -> None:
    """Gemma-style :func:`fused_add_rmsnorm`: the scale is ``weight + 1``. In place, ``None``."""
    _fused_add_rmsnorm(input, residual, weight, eps, 1.0, backend)


@flashinfer_api
def layernorm(input: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-6, *,
              backend: str = "auto") -> torch.Tensor:
    """LayerNorm over the last dim: ``(x - mean) * rsqrt(var + eps) * gemma + beta``.

    ``input``: ``[batch, hidden]`` (upstream: bf16; fp16/fp32 accepted too), any strides.
    ``gemma`` (upstream's spelling of gamma) and ``beta``: ``[hidden]``, fp32 upstream
    (fp16/bf16 accepted). Returns a new ``[batch, hidden]`` tensor of ``input``'s dtype; the
    statistics (biased variance) are computed in fp32.
    """
    _check_rows(input, (2,), "2-D [batch, hidden]")
    _check_vector("gemma", gemma, input)
    _check_vector("beta", beta, input)
    _check_backend(backend)
    eps = _check_eps(eps)
    out = torch.empty_like(input)
    _layernorm_op(out, input, gemma, beta, eps, backend)
    return out


# --------------------------------------------------------------------------------------------
# RMSNorm into fp8 (upstream's rmsnorm_quant / fused_add_rmsnorm_quant)

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _quant_scale_inv(scale, input: torch.Tensor):
    """``1 / scale`` in float32: a Python float for a float ``scale``, else a one-element float32
    tensor on ``input``'s device (upstream's ``scale`` is either)."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.is_floating_point():
            raise ValueError(f"scale must be a float or a one-element float tensor, got "
                             f"{scale.dtype} of shape {tuple(scale.shape)}")
        if scale.device != input.device:
            raise ValueError(f"scale is on {scale.device} but input is on {input.device}")
        return torch.reciprocal(scale.reshape(()).float())
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or a one-element float tensor, got "
                        f"{type(scale).__name__}")
    if not 0 < scale < math.inf:
        raise ValueError(f"scale must be a finite float > 0, got {scale!r}")
    return float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(scale, dtype=torch.float32))


def _check_fp8_out(out, input: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype not in _FP8:
        raise TypeError(f"out dtype {out.dtype} is not supported; allowed: float8_e4m3fn, "
                        "float8_e5m2 (the dtype the result is quantised to)")
    if out.shape != input.shape:
        raise ValueError(f"out must have input's shape {tuple(input.shape)}, got {tuple(out.shape)}")
    _same_device("out", out, input)


def _quantised_rmsnorm(out, x, weight, scale_inv, eps: float, function: str, backend: str) -> None:
    """``out = clamp(rmsnorm(x) * weight * scale_inv, -M, M)`` cast to out's fp8 dtype (``M``
    its largest finite value: 448 for e4m3, 57344 for e5m2, as upstream), all in float32 (the
    RMSNorm op on a float32 copy of ``x``, then the scale, clamp and cast)."""
    check_writable(function, "out", out)
    check_no_overlap(function, "out", out, input=x, weight=weight)
    _store_fp8(out, _rmsnorm(x.float(), weight.float(), eps, None, 0.0, backend), scale_inv)


def _store_fp8(out: torch.Tensor, y: torch.Tensor, scale_inv) -> None:
    """``out = fp8(clamp(y * scale_inv, -M, M))`` (``y`` float32, modified), ``M`` the largest
    finite value of out's dtype; NaN stays NaN; rounded to nearest even."""
    bound = torch.finfo(out.dtype).max
    out.copy_(y.mul_(scale_inv).clamp_(-bound, bound))


@flashinfer_api
def rmsnorm_quant(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, scale,
                  eps: float = 1e-6, enable_pdl: Optional[bool] = None, *,
                  backend: str = "auto") -> None:
    """RMSNorm quantised to fp8, written into ``out``:
    ``out = fp8(clamp(input * rsqrt(mean(input^2) + eps) * weight / scale, -M, M))``, ``M`` the
    largest finite value of out's dtype (448 for e4m3, 57344 for e5m2).

    ``out``: ``input``'s shape, float8_e4m3fn or float8_e5m2; ``input`` ``[batch, hidden]`` (or
    ``[batch, heads, head_dim]``) fp16/bf16/fp32; ``weight`` ``[hidden]``; ``scale``: the
    quantisation scale, a finite float > 0 or a one-element float tensor on input's device
    (multiplied in as ``1 / scale`` in float32, as upstream). Everything before the cast is
    float32: the RMSNorm op (dispatched, ``backend``) on a float32 copy, then the scale and the
    clamp. Returns None.
    """
    eps = _check_rmsnorm_args(input, weight, eps, backend)
    _check_fp8_out(out, input)
    inv = _quant_scale_inv(scale, input)
    if input.numel():
        _quantised_rmsnorm(out, input, weight, inv, eps, "rmsnorm_quant", backend)


@flashinfer_api
def layernorm_quant(out: torch.Tensor, input: torch.Tensor, gemma: torch.Tensor,
                    beta: torch.Tensor, scale, eps: float = 1e-6, *, backend: str = "auto") -> None:
    """LayerNorm quantised to fp8, written into ``out``, as upstream: the :func:`layernorm`
    result rounded to ``input``'s dtype, then ``fp8(clamp(y * (1 / scale), -M, M))`` in float32
    (``M``: 448 for e4m3, 57344 for e5m2; NaN stays NaN).

    ``out``: ``input``'s shape, float8_e4m3fn or float8_e5m2; ``input`` ``[batch, hidden]``
    (upstream: bf16; fp16/fp32 accepted); ``gemma``, ``beta`` ``[hidden]``; ``scale``: a finite
    float > 0 or a one-element float tensor on input's device. Returns None.
    """
    _check_fp8_out(out, input)
    inv = _quant_scale_inv(scale, input)
    normed = layernorm(input, gemma, beta, eps, backend=backend)
    check_writable("layernorm_quant", "out", out)
    check_no_overlap("layernorm_quant", "out", out, input=input, gemma=gemma, beta=beta)
    _store_fp8(out, normed.float(), inv)


@flashinfer_api
def fused_add_rmsnorm_quant(out: torch.Tensor, input: torch.Tensor, residual: torch.Tensor,
                            weight: torch.Tensor, scale, eps: float = 1e-6,
                            enable_pdl: Optional[bool] = None, *, backend: str = "auto") -> None:
    """In place ``residual += input`` (rounded to residual's dtype), then
    :func:`rmsnorm_quant` of the new residual into ``out``. ``input`` is not written (upstream
    mutates ``out`` and ``residual`` only). Same shapes and dtype rules as :func:`rmsnorm_quant`;
    ``residual`` like ``input``, sharing no memory with it, ``weight`` or ``out``. Returns None.
    """
    eps = _check_rmsnorm_args(input, weight, eps, backend)
    _check_like("residual", residual, input)
    _check_fp8_out(out, input)
    inv = _quant_scale_inv(scale, input)
    check_writable("fused_add_rmsnorm_quant", "residual", residual)
    check_no_overlap("fused_add_rmsnorm_quant", "residual", residual, input=input, weight=weight)
    check_no_overlap("fused_add_rmsnorm_quant", "out", out, residual=residual)
    if input.numel():
        residual.add_(input)
        _quantised_rmsnorm(out, residual, weight, inv, eps, "fused_add_rmsnorm_quant", backend)
