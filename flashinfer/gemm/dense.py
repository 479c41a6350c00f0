"""Dense GEMM (upstream module ``flashinfer.gemm``): bf16 ``mm_bf16``, per-tensor fp8 ``bmm_fp8``
and ``mm_fp8``, block-scaled fp8 ``gemm_fp8_nt_groupwise`` and ``gemm_fp8_nt_blockscaled``,
block-scaled FP4 ``mm_fp4`` (NVFP4 / MXFP4).

Names, argument order, defaults of the tensor arguments, output allocation and return
conventions are upstream's (api-spec.md §3): each function returns ``out`` (allocated when not
given, else written in place and returned). Layouts: ``mm_bf16`` takes ``a [m, k]`` and
``b [k, n]`` (upstream wants ``b`` column-major, i.e. ``weight.T``; any strides work here);
``bmm_fp8`` ``A [b, m, k]``, ``B [b, k, n]``; ``mm_fp8`` and the groupwise GEMMs take the
weight as ``b [n, k]`` ("NT"). Outputs are row-major and must be contiguous when given.

Backends
--------
``backend="auto"`` (our default for every function here) lets the dispatcher choose; upstream's
defaults (``"cudnn"`` for mm_bf16, ``"cublas"`` for bmm_fp8, ``"trtllm_low_latency"`` for
mm_fp8, ``"cutlass"`` for gemm_fp8_nt_groupwise) name vendor kernels that may not be installed,
so they are not the default here (api-spec §13 item 9). Upstream's spellings are accepted:
``"cublas"`` and ``"cublaslt"`` mean ``torch`` (torch's GEMMs are cuBLAS / cuBLASLt);
``"cudnn"``, ``"cutlass"``, ``"cute-dsl"`` and ``"trtllm"`` name those backends (an error with
their reasons while they declare no kernel for the op); ``"tgv"``, ``"tinygemm"``, ``"cutile"``,
``"trtllm_low_latency"`` and ``"cutedsl_low_latency"`` have no counterpart and raise
``ValueError``. ``pdl`` and ``mma_sm`` are accepted and ignored (they tune launches, not results).

Canonical kernel signatures (every backend registers exactly these; kernels write all of ``out``)
---------------------------------------------------------------------------------------------------
* ``mm_bf16`` (op ``"mm_bf16"``): ``kernel(a, b, bias, out) -> None``; ``a [M, K]``,
  ``b [K, N]`` bf16, any strides; ``bias`` None or bf16 ``[N]``; ``out [M, N]`` contiguous
  bf16/fp16/fp32. ``out = a @ b (+ bias)``, fp32 accumulation.
* ``bmm_fp8`` (op ``"bmm_fp8"``; ``mm_fp8`` too, with batch 1): ``kernel(A, B, A_scale, B_scale,
  out) -> None``; ``A [Bt, M, K]``, ``B [Bt, K, N]`` float8_e4m3fn/e5m2, any strides, or all
  three 2-D (``A [M, K]``, ``B [K, N]``, ``out [M, N]``: one product, how mm_fp8 calls, so its
  hot path makes no batch views); scales fp32 with one element each, on the device; ``out``
  contiguous bf16/fp16. ``out = (A @ B) * A_scale * B_scale``.
* ``gemm_fp8_groupwise`` (op ``"gemm_fp8_groupwise"``): ``kernel(a, b, a_scale, b_scale,
  granularity, out) -> None``; ``a [M, K]``, ``b [N, K]`` fp8; ``granularity = (gm, gn, gk)``;
  ``a_scale [ceil(M/gm), ceil(K/gk)]``, ``b_scale [ceil(N/gn), ceil(K/gk)]`` fp32, any strides
  (MN-major scales arrive transposed, as views); ``out [M, N]`` contiguous bf16/fp16.
  ``out[i, j] = sum_k a[i,k] a_scale[i//gm, k//gk] * b[j,k] b_scale[j//gn, k//gk]``.

* ``mm_fp4`` (op ``"mm_fp4"``): ``kernel(a, b, a_sf, b_sf, alpha, block_size, a_sf_8x4, out)
  -> None``; ``a [M, K/2]``, ``b [K/2, N]`` uint8 packed e2m1 (any strides; ``b.T`` is the
  ``[N, K/2]`` packed weight); ``a_sf`` the 128x4 (8x4 when ``a_sf_8x4``) swizzled storage of
  a's ``[M, K/block_size]`` scales, ``b_sf`` the 128x4 storage of the weight's
  ``[N, K/block_size]`` scales, any shape holding it (read in row-major order); scales e4m3
  (``float8_e4m3fn`` or its uint8 bytes) for ``block_size`` 16, UE8M0 uint8 for 32; ``alpha``
  None or fp32 one element; ``out [M, N]`` contiguous bf16/fp16.
  ``out = alpha * dequant(a) @ dequant(b)`` (layouts: :mod:`flashinfer.fp4_format`).

Scales multiply (they are dequantisation scales, ``amax / fp8_max``). K or N that is not a
multiple of the scale granularity is served (the last block is partial) by the reference;
kernels with alignment needs (torch's cuBLASLt: K and N multiples of 16) declare them in their
capability records and are skipped, or named with their reason when asked for.

Aliasing: a GEMM reads every operand while it writes ``out`` (tiles of ``out`` are stored
while other tiles still read ``a`` and ``b``), so an ``out=`` that shares any memory with an
operand, a scale, ``alpha`` or ``bias`` raises ``ValueError`` naming both (even exactly the
same tensor: ``mm_bf16(a, b, out=a)`` with a square ``b`` is refused). Different allocations
cost two pointer reads per pair.

Values: scales and ``alpha`` are device tensors and are not read back: NaN or inf in them (or
in the operands) propagate through the products (NaN in, NaN out; ``0 * inf`` is NaN); a zero
scale gives zeros. Per-tensor scales and ``alpha`` multiply the finished dot products on every
backend, so non-finite ones give the same NaN / inf pattern everywhere. Block scales of
``gemm_fp8_nt_groupwise`` do not: the reference dequantises the operands first (an inf scale
times a zero element is NaN; a huge one can overflow float32), Triton scales each K step's
dot; both give non-finite outputs there, not always the same ones. An empty ``m`` or ``n`` returns an empty ``out`` without launching; ``k = 0``
gives ``out = 0`` (plus ``bias``) without launching either (the scales are not read).

Dispatch Problem: dtypes ``a``, ``b``, ``out``; shape facts ``m`` (bucketed to a power of two),
``n``, ``k`` (and ``batch``, bucketed, for bmm_fp8); groupwise features ``scale_rowwise``
(granularity ``(1, 1, >=K)``), ``scale_1x128`` (``(1, 128, 128)``), ``scale_128x128``
(``(128, 128, 128)``) or ``scale_groupwise`` (any other); ``mm_fp4`` features ``mxfp4``
(block 32, UE8M0 scales) and ``sf_8x4`` (a's scales in the 8x4 layout).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .. import dispatch
from ..aliasing import check_no_overlap, in_storage_of
from ..api_logging import flashinfer_api
from ..checked_calls import CheckedCalls, tensor_fact
from ..custom_op import custom_op
from ..dispatch import Problem
from .checks import (
    BF16_OUT, FP8, FP8_OUT, backend_arg, block_scale_arg, cdiv, dtype_names, empty_k,
    granularity_arg, no_output, out_dtype_arg, output_arg, scalar_scale_arg, scale_feature,
    tensor_arg,
)

__all__ = ["mm_bf16", "bmm_fp8", "mm_fp8", "gemm_fp8_nt_groupwise", "gemm_fp8_nt_blockscaled",
           "mm_fp4"]

# --------------------------------------------------------------------------------------------
# custom ops (dispatch + kernel call; opaque to torch.compile)


@custom_op("mm_bf16", mutates_args=("out",), fake=no_output)
def _mm_bf16_op(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                bias: Optional[torch.Tensor], backend: str) -> None:
    m, n, k = dispatch.length_bucket(a.shape[0]), b.shape[1], a.shape[1]
    has_bias = bias is not None

    def problem() -> Problem:
        return Problem.make("mm_bf16", a.device,
                            dtypes={"a": a.dtype, "b": b.dtype, "out": out.dtype},
                            shape={"m": m, "n": n, "k": k},
                            features=("bias",) if has_bias else ())

    check_no_overlap("mm_bf16", "out", out, a=a, b=b, bias=bias)
    decision = dispatch.decide_keyed(
        ("mm_bf16", a.device, a.dtype, b.dtype, out.dtype, m, n, k, has_bias), problem, backend)
    if a.shape[1] == 0:
        empty_k(out, bias)
    else:
        decision.kernel(a, b, bias, out)


def _bmm_fp8_decision(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor,
                      backend: str) -> dispatch.Decision:
    """The Decision of op ``bmm_fp8`` for ``A [b, m, k]``, ``B [b, k, n]``, or the 2-D form
    (``A [m, k]``, ``B [k, n]``: batch 1) that mm_fp8 passes."""
    return dispatch.decide_keyed(*_bmm_fp8_facts(A, B, out), backend)


def _bmm_fp8_facts(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> tuple:
    """``(key, make_problem)`` of op ``bmm_fp8`` (:func:`flashinfer.dispatch.decide_keyed`)."""
    if A.dim() == 2:
        (m, k), n, batch = A.shape, B.shape[1], 1
    else:
        (batch, m, k), n = A.shape, B.shape[2]
    batch, m = dispatch.length_bucket(batch), dispatch.length_bucket(m)

    def problem() -> Problem:
        return Problem.make("bmm_fp8", A.device,
                            dtypes={"a": A.dtype, "b": B.dtype, "out": out.dtype},
                            shape={"batch": batch, "m": m, "n": n, "k": k})

    key = ("bmm_fp8", A.device, A.dtype, B.dtype, out.dtype, batch, m, n, k)
    return key, problem


#: eager bmm_fp8 / mm_fp8 calls that passed every check (:mod:`flashinfer.checked_calls`) ->
#: (the backend spelling, out's shape and dtype, the call's KeyedDecision)
_CHECKED_FP8 = CheckedCalls()


def _fp8_signature(a, b, scale_a, scale_b, dtype, out, backend) -> tuple | None:
    """bmm_fp8 / mm_fp8's memo key (a and b tensors; the scales and out a tensor or None), or
    None."""
    if (not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor)
            or torch.compiler.is_compiling()):
        return None
    facts = [tensor_fact(a), tensor_fact(b)]
    for t in (scale_a, scale_b, out):
        if t is None:
            facts.append(None)
        elif isinstance(t, torch.Tensor):
            facts.append(tensor_fact(t))
        else:
            return None
    return (*facts, out is None or out.is_contiguous(), dtype, type(backend), backend)


def _checked_fp8(function: str, hit: tuple, a, b_kn, scale_a, scale_b, out, names: tuple):
    """A memoised bmm_fp8 / mm_fp8 call (``b_kn``: the kernels' ``[.., k, n]`` operand): its
    output, out's aliasing (``names``: the four operands as the function calls them), the
    Decision of the stored key, the kernel."""
    spelled, shape, dtype, choice = hit
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=a.device)
    elif in_storage_of(out, a, b_kn, scale_a, scale_b):
        check_no_overlap(function, "out", out, **dict(zip(names, (a, b_kn, scale_a, scale_b))))
    kernel = choice.get(spelled).kernel
    if scale_a is None or scale_b is None:
        one = _one(a.device)
        scale_a, scale_b = one if scale_a is None else scale_a, one if scale_b is None else scale_b
    kernel(a, b_kn, scale_a, scale_b, out)
    return out


#: a one-element fp32 1.0 per device: the second scale of mm_fp8 (one fill, not one per call)
_ONES: dict[torch.device, torch.Tensor] = {}


def _one(device: torch.device) -> torch.Tensor:
    one = _ONES.get(device)
    if one is None:
        one = torch.ones((), dtype=torch.float32, device=device)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return one  # a tensor made during capture lives in the graph's pool: not kept
        _ONES[device] = one
    return one


@custom_op("bmm_fp8", mutates_args=("out",), fake=no_output)
def _bmm_fp8_op(out: torch.Tensor, A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor,
                B_scale: torch.Tensor, backend: str) -> None:
    check_no_overlap("bmm_fp8", "out", out, A=A, B=B, A_scale=A_scale, B_scale=B_scale)
    decision = _bmm_fp8_decision(A, B, out, backend)
    if A.shape[2] == 0:
        empty_k(out)
    else:
        decision.kernel(A, B, A_scale, B_scale, out)


@custom_op("mm_fp8", mutates_args=("out",), fake=no_output)
def _mm_fp8_op(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               alpha: Optional[torch.Tensor], backend: str) -> None:
    check_no_overlap("mm_fp8", "out", out, a=a, b=b, alpha=alpha)
    b_kn = b.t()  # the kernels' 2-D form: a [m, k] @ b_kn [k, n] -> out [m, n]
    decision = _bmm_fp8_decision(a, b_kn, out, backend)
    if a.shape[1] == 0:
        empty_k(out)
        return
    one = _one(a.device)
    decision.kernel(a, b_kn, one if alpha is None else alpha, one, out)


@custom_op("gemm_fp8_groupwise", mutates_args=("out",), fake=no_output)
def _gemm_fp8_groupwise_op(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                           a_scale: torch.Tensor, b_scale: torch.Tensor, gm: int, gn: int,
                           gk: int, backend: str) -> None:
    k = a.shape[1]
    problem = Problem.make("gemm_fp8_groupwise", a.device,
                           dtypes={"a": a.dtype, "b": b.dtype, "out": out.dtype},
                           shape={"m": dispatch.length_bucket(a.shape[0]), "n": b.shape[0],
                                  "k": k},
                           features=(scale_feature((gm, gn, gk), k),))
    check_no_overlap("gemm_fp8_nt_groupwise", "out", out, a=a, b=b, a_scale=a_scale,
                     b_scale=b_scale)
    decision = dispatch.decide(problem, backend)
    if k == 0:
        empty_k(out)
    else:
        decision.kernel(a, b, a_scale, b_scale, (gm, gn, gk), out)


@custom_op("mm_fp4", mutates_args=("out",), fake=no_output)
def _mm_fp4_op(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_descale: torch.Tensor,
               b_descale: torch.Tensor, alpha: Optional[torch.Tensor], block_size: int,
               use_8x4_sf_layout: bool, backend: str) -> None:
    features = (("mxfp4",) if block_size == 32 else ()) + (("sf_8x4",) if use_8x4_sf_layout else ())
    problem = Problem.make("mm_fp4", a.device,
                           dtypes={"a": a.dtype, "b": b.dtype, "out": out.dtype},
                           shape={"m": dispatch.length_bucket(a.shape[0]), "n": b.shape[1],
                                  "k": 2 * a.shape[1]},
                           features=features)
    check_no_overlap("mm_fp4", "out", out, a=a, b=b, a_descale=a_descale, b_descale=b_descale,
                     alpha=alpha)
    decision = dispatch.decide(problem, backend)
    if a.shape[1] == 0:
        empty_k(out)
    else:
        decision.kernel(a, b, a_descale, b_descale.t(), alpha, block_size, use_8x4_sf_layout,
                        out)


# --------------------------------------------------------------------------------------------
# public API


@flashinfer_api
def mm_bf16(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
            pdl: bool = False, out: Optional[torch.Tensor] = None,
            out_dtype: torch.dtype = torch.bfloat16, backend: str = "auto") -> torch.Tensor:
    """``out = a @ b (+ bias)``: ``a [m, k]``, ``b [k, n]`` bf16 (upstream: ``b`` column-major);
    ``bias`` optional bf16 ``[n]``; ``out``/``out_dtype`` bf16, fp16 or fp32 (``out``'s dtype
    must equal ``out_dtype``). Runs on every SM (fp32 accumulation). Returns ``out [m, n]``.
    ``pdl`` is ignored. ``backend``: see the module docstring.
    """
    tensor_arg("a", a, 2, (torch.bfloat16,))
    tensor_arg("b", b, 2, (torch.bfloat16,), a.device)
    if b.shape[0] != a.shape[1]:
        raise ValueError(f"b must be [k, n] with k = a.shape[1] = {a.shape[1]}, "
                         f"got b.shape {tuple(b.shape)}")
    if bias is not None:
        tensor_arg("bias", bias, 1, (torch.bfloat16,), a.device)
        if bias.shape[0] != b.shape[1]:
            raise ValueError(f"bias must have shape ({b.shape[1]},), got {tuple(bias.shape)}")
    backend = backend_arg(backend)
    out = output_arg(out, (a.shape[0], b.shape[1]), out_dtype_arg("out_dtype", out_dtype, BF16_OUT),
                  a.device)
    if out.numel():
        _mm_bf16_op(out, a, b, bias, backend)
    return out


@flashinfer_api
def bmm_fp8(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
            dtype: torch.dtype, out: Optional[torch.Tensor] = None,
            backend: str = "auto") -> torch.Tensor:
    """Batched fp8 GEMM with per-tensor scales: ``out[i] = (A[i] @ B[i]) * A_scale * B_scale``.

    ``A [b, m, k]``, ``B [b, k, n]`` float8_e4m3fn / float8_e5m2 (upstream: ``B`` column-major);
    ``A_scale``, ``B_scale``: fp32 one-element tensors (dequantisation scales); ``dtype``: output
    dtype, bf16 or fp16. Returns ``out [b, m, n]``. ``backend``: see the module docstring.
    """
    signature = _fp8_signature(A, B, A_scale, B_scale, dtype, out, backend)
    hit = _CHECKED_FP8.get(signature)
    if hit is not None:  # the steady state: checked, dispatch facts kept
        return _checked_fp8("bmm_fp8", hit, A, B, A_scale, B_scale, out,
                            ("A", "B", "A_scale", "B_scale"))
    tensor_arg("A", A, 3, FP8)
    tensor_arg("B", B, 3, FP8, A.device)
    if B.shape[0] != A.shape[0] or B.shape[1] != A.shape[2]:
        raise ValueError(f"B must be [b, k, n] = [{A.shape[0]}, {A.shape[2]}, n] to match "
                         f"A {tuple(A.shape)}, got B.shape {tuple(B.shape)}")
    scalar_scale_arg("A_scale", A_scale, A.device)
    scalar_scale_arg("B_scale", B_scale, A.device)
    backend = backend_arg(backend)
    out = output_arg(out, (A.shape[0], A.shape[1], B.shape[2]), out_dtype_arg("dtype", dtype, FP8_OUT),
                  A.device)
    if out.numel():
        _bmm_fp8_op(out, A, B, A_scale, B_scale, backend)
        if A.shape[2]:
            _CHECKED_FP8.put(signature, (backend, out.shape, out.dtype,
                                         dispatch.KeyedDecision(*_bmm_fp8_facts(A, B, out))))
    return out


@flashinfer_api
def mm_fp8(a: torch.Tensor, b: torch.Tensor, alpha: Optional[torch.Tensor] = None,
           out_dtype: torch.dtype = torch.bfloat16, out: Optional[torch.Tensor] = None,
           backend: str = "auto") -> torch.Tensor:
    """fp8 GEMM ``out = alpha * (a @ b.T)``: ``a [m, k]``, ``b [n, k]`` (the unprocessed weight)
    float8_e4m3fn / e5m2; ``alpha`` None (1.0) or an fp32 one-element tensor, typically
    ``a_scale * b_scale``; output bf16 only (upstream). Returns ``out [m, n]``.

    Upstream's pre-shuffled ``[k // 128, n, 128]`` weights (``prepare_low_latency_gemm_weights``)
    need its trtllm low-latency kernel, which this library does not have: they are rejected.
    """
    signature = _fp8_signature(a, b, alpha, None, out_dtype, out, backend)
    hit = _CHECKED_FP8.get(signature)
    if hit is not None:
        return _checked_fp8("mm_fp8", hit, a, b.t(), alpha, None, out, ("a", "b", "alpha", "-"))
    tensor_arg("a", a, 2, FP8)
    if isinstance(b, torch.Tensor) and b.dim() == 3:
        raise ValueError(f"b of shape {tuple(b.shape)} looks like a prepared [k // 128, n, 128] "
                         "weight (prepare_low_latency_gemm_weights), which needs upstream's "
                         "trtllm_low_latency kernel (not available here); pass the unprocessed "
                         "[n, k] weight")
    tensor_arg("b", b, 2, FP8, a.device)
    if b.shape[1] != a.shape[1]:
        raise ValueError(f"b must be [n, k] with k = a.shape[1] = {a.shape[1]}, "
                         f"got b.shape {tuple(b.shape)}")
    if alpha is not None:
        scalar_scale_arg("alpha", alpha, a.device)
    backend = backend_arg(backend)
    out = output_arg(out, (a.shape[0], b.shape[0]),
                  out_dtype_arg("out_dtype", out_dtype, (torch.bfloat16,)), a.device)
    if out.numel():
        _mm_fp8_op(out, a, b, alpha, backend)
        if a.shape[1]:
            _CHECKED_FP8.put(signature, (backend, out.shape, out.dtype,
                                         dispatch.KeyedDecision(*_bmm_fp8_facts(a, b.t(), out))))
    return out


@flashinfer_api
def gemm_fp8_nt_groupwise(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                          b_scale: torch.Tensor, scale_major_mode: Optional[str] = None,
                          mma_sm: int = 1,
                          scale_granularity_mnk: Tuple[int, int, int] = (1, 128, 128),
                          out: Optional[torch.Tensor] = None,
                          out_dtype: Optional[torch.dtype] = None,
                          backend: str = "auto") -> torch.Tensor:
    """fp8 GEMM with block scales: ``out = dequant(a) @ dequant(b).T``.

    ``a [m, k]``, ``b [n, k]`` float8_e4m3fn / e5m2. With ``scale_granularity_mnk = (gm, gn, gk)``
    the fp32 scales are ``a_scale [ceil(m/gm), ceil(k/gk)]`` and ``b_scale [ceil(n/gn),
    ceil(k/gk)]`` for ``scale_major_mode`` ``"K"`` or ``None``, transposed (``[ceil(k/gk), *]``)
    for ``"MN"``. Output bf16 (default) or fp16; ``out``'s dtype wins over ``out_dtype``, as
    upstream. Returns ``out [m, n]``. ``mma_sm`` (1 or 2) is ignored.
    """
    tensor_arg("a", a, 2, FP8)
    tensor_arg("b", b, 2, FP8, a.device)
    if b.shape[1] != a.shape[1]:
        raise ValueError(f"b must be [n, k] with k = a.shape[1] = {a.shape[1]}, "
                         f"got b.shape {tuple(b.shape)}")
    if scale_major_mode not in (None, "K", "MN"):
        raise ValueError(f"scale_major_mode must be None, 'K' or 'MN', got {scale_major_mode!r}")
    if mma_sm not in (1, 2):
        raise ValueError(f"mma_sm must be 1 or 2, got {mma_sm!r}")
    gm, gn, gk = granularity_arg(scale_granularity_mnk)
    (m, k), n = a.shape, b.shape[0]
    a_scale = block_scale_arg("a_scale", a_scale, cdiv(m, gm), cdiv(k, gk), scale_major_mode,
                           a.device)
    b_scale = block_scale_arg("b_scale", b_scale, cdiv(n, gn), cdiv(k, gk), scale_major_mode,
                           a.device)
    backend = backend_arg(backend)
    if out is not None and isinstance(out, torch.Tensor):
        out_dtype = out.dtype
    dtype = out_dtype_arg("out_dtype", out_dtype or torch.bfloat16, FP8_OUT)
    out = output_arg(out, (m, n), dtype, a.device)
    if out.numel():
        _gemm_fp8_groupwise_op(out, a, b, a_scale, b_scale, gm, gn, gk, backend)
    return out


@flashinfer_api
def gemm_fp8_nt_blockscaled(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                            b_scale: torch.Tensor, scale_major_mode: Optional[str] = "MN",
                            mma_sm: int = 1, out: Optional[torch.Tensor] = None,
                            out_dtype: Optional[torch.dtype] = None, *,
                            backend: str = "auto") -> torch.Tensor:
    """:func:`gemm_fp8_nt_groupwise` with ``scale_granularity_mnk = (128, 128, 128)``: scales
    ``[ceil(m/128), ceil(k/128)]`` and ``[ceil(n/128), ceil(k/128)]`` (transposed for the
    default ``scale_major_mode="MN"``)."""
    return gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode, mma_sm,
                                 (128, 128, 128), out, out_dtype, backend)


_FP4_PACKED = (torch.uint8,) + ((torch.float4_e2m1fn_x2,) if hasattr(torch, "float4_e2m1fn_x2")
                                 else ())


def _fp4_scale(name: str, t, rows: int, cols: int, layout, transposed: bool, use_nvfp4: bool,
               device) -> torch.Tensor:
    """Check a swizzled scale tensor: 2-D, holding the layout's padded storage, the scale
    columns (``cols`` or padded to 4) on dim 1 (dim 0 when ``transposed``)."""
    from ..fp4_format import sf_storage_shape

    allowed = (torch.float8_e4m3fn, torch.uint8) if use_nvfp4 else (torch.uint8,)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in allowed:
        raise ValueError(f"{name} has unsupported dtype {t.dtype}; allowed with use_nvfp4="
                         f"{use_nvfp4}: {dtype_names(allowed)}")
    srows, scols = sf_storage_shape(rows, cols, layout)
    col_dim = 0 if transposed else 1
    if t.dim() != 2 or t.shape[col_dim] not in (cols, scols) or t.numel() != srows * scols:
        want = f"[{cols}, *]" if transposed else f"[*, {cols}]"
        raise ValueError(f"{name} must be the {layout.name} swizzled scales of {rows} rows x "
                         f"{cols} blocks: 2-D {want} holding {srows} x {scols} elements (from "
                         f"nvfp4_quantize / fp4_quantize{', transposed' if transposed else ''}), "
                         f"got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but a is on {device}")
    return t


@flashinfer_api
def mm_fp4(a: torch.Tensor, b: torch.Tensor, a_descale: torch.Tensor, b_descale: torch.Tensor,
           alpha: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.bfloat16,
           out: Optional[torch.Tensor] = None, block_size: int = 16,
           use_8x4_sf_layout: bool = False, backend: str = "auto", use_nvfp4: bool = True,
           enable_pdl: bool = True) -> torch.Tensor:
    """FP4 GEMM ``out = alpha * dequant(a) @ dequant(b)``.

    ``a [m, k/2]`` packed e2m1 (uint8, or float4_e2m1fn_x2), ``b [k/2, n]``: the transposed
    ``[n, k/2]`` packed weight (upstream passes ``weight_fp4.T``). NVFP4 (``use_nvfp4=True``,
    ``block_size=16``): e4m3 scales (``float8_e4m3fn`` or their uint8 bytes); MXFP4
    (``use_nvfp4=False``, ``block_size=32``): UE8M0 uint8 scales. ``a_descale``: a's scales in
    the 128x4 swizzled layout (8x4 with ``use_8x4_sf_layout``), as ``fp4_quantize`` /
    ``nvfp4_quantize`` return them (``[*, k/block_size]``); ``b_descale``: the weight's 128x4
    scales transposed (``weight_sf.T``, ``[k/block_size, *]``). ``alpha``: None (1) or an fp32
    one-element tensor, typically ``1 / (a_global_sf * b_global_sf)``. Output bf16 (default) or
    fp16. Returns ``out [m, n]``. ``enable_pdl`` is ignored.

    ``backend``: ``"auto"``, ``"torch"`` (dequantise to bf16 + cuBLAS), ``"reference"``
    (float64); upstream's ``"cudnn"``, ``"cutlass"``, ``"trtllm"``, ``"cute-dsl"`` name native
    FP4 kernels that are not wired here (an error with their reasons), ``"b12x"`` has no
    counterpart (``ValueError``).
    """
    from ..fp4_format import SfLayout

    tensor_arg("a", a, 2, _FP4_PACKED)
    tensor_arg("b", b, 2, _FP4_PACKED, a.device)
    if b.shape[0] != a.shape[1]:
        raise ValueError(f"b must be [k/2, n] with k/2 = a.shape[1] = {a.shape[1]} (pass the "
                         f"packed [n, k/2] weight transposed), got b.shape {tuple(b.shape)}")
    if not isinstance(use_nvfp4, bool):
        raise TypeError(f"use_nvfp4 must be a bool, got {type(use_nvfp4).__name__}")
    if isinstance(block_size, bool) or block_size not in (16, 32):
        raise ValueError(f"block_size must be 16 (NVFP4) or 32 (MXFP4), got {block_size!r}")
    if block_size != (16 if use_nvfp4 else 32):
        raise ValueError(f"block_size={block_size} does not match use_nvfp4={use_nvfp4}: NVFP4 "
                         "uses block_size=16, MXFP4 (use_nvfp4=False) block_size=32")
    (m, half_k), n = a.shape, b.shape[1]
    k = 2 * half_k
    if k % block_size:
        raise ValueError(f"k = 2 * a.shape[1] = {k} must be a multiple of block_size = "
                         f"{block_size}")
    cols = k // block_size
    a_layout = SfLayout.layout_8x4 if use_8x4_sf_layout else SfLayout.layout_128x4
    _fp4_scale("a_descale", a_descale, m, cols, a_layout, False, use_nvfp4, a.device)
    _fp4_scale("b_descale", b_descale, n, cols, SfLayout.layout_128x4, True, use_nvfp4, a.device)
    if alpha is not None:
        scalar_scale_arg("alpha", alpha, a.device)
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend.strip().lower() == "b12x":
        raise ValueError("backend='b12x' is an upstream FlashInfer kernel with no counterpart "
                         "in this library; use 'auto', 'torch' or 'reference'")
    backend = backend_arg(backend)
    out = output_arg(out, (m, n), out_dtype_arg("out_dtype", out_dtype, FP8_OUT), a.device)
    if out.numel():
        packed_a = a if a.dtype == torch.uint8 else a.view(torch.uint8)
        packed_b = b if b.dtype == torch.uint8 else b.view(torch.uint8)
        _mm_fp4_op(out, packed_a, packed_b, a_descale, b_descale, alpha, block_size,
                   bool(use_8x4_sf_layout), backend)
    return out


