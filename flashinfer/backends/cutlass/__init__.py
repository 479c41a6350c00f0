"""cutlass adapter: GEMMs through CUTLASS's Python interface (nvidia-cutlass, module
``cutlass_cppgen``), kernels compiled once into a disk cache; CUTLASS FP4 declared only.

* ``mm_bf16``: ``out [m, n] = a [m, k] @ b [k, n]``, bf16 in and out, fp32 accumulation, ``b``
  row-major or column-major (upstream passes the transposed ``[n, k]`` weight); one kernel per
  ``b`` layout. No bias.
* ``bmm_fp8`` (and ``mm_fp8``, which the facade routes through it): ``out[i] = A[i] @ B[i] *
  A_scale * B_scale`` for the whole batch in **one launch** (torch's ``_scaled_mm`` takes one
  call per batch entry), e4m3 x e4m3, bf16 or fp16 out, ``B`` column-major (upstream's
  layout; fp8 tensor cores read both operands K-major, so a row-major ``B`` is copied). The two
  per-tensor scales are read on the device by the epilogue (an EVT: two scalar broadcasts), so
  the call never synchronises and is capturable in a CUDA graph.

Every kernel is built for 16-byte rows (k and n multiples of 8 for bf16; k of 16, n of 8 for
fp8: the adapter check and the capability record) and 16-byte aligned base pointers (an
operand that is not is copied first). Kernel specs, compilation, the disk cache, cuda-bindings 13
and the launch are in :mod:`.runtime`; ``flashinfer warmup --cutlass`` compiles every kernel
ahead of serving (:func:`compile_all`, nvcc in parallel).

Where it stands on the H200 (``dispatch_rules/mm_bf16.toml``, ``bmm_fp8.toml``): correct, and
the only one-launch batched fp8 GEMM among the vendor kernels here besides cuDNN's graphs, but
not the fastest anywhere. CUTLASS's default tiles reach 0.2-0.85x cuBLAS for ``mm_bf16`` and
0.33x cuBLASLt for fp8 at 8192^3; at DeepSeek-V3's batched MLA shapes (batch 128) one launch
takes 28-111 us of GPU time against 370-470 for torch's per-batch loop, but 6-76 for our Triton
kernel and cuDNN; an eager call costs 0.4-0.9 ms of host time (cutlass_cppgen builds the
arguments in Python). So ``auto`` reaches CUTLASS only where the others are missing; it is a
second vendor kernel to cross-check against and to force (``backend="cutlass"``).
"""

from __future__ import annotations

import time

import torch

from ...reasons import Reason
from . import runtime
from .runtime import KernelSpec

#: the layouts of ``b`` one kernel each serves (``mm_bf16``)
B_LAYOUTS = ("row", "column")
_ALIGN = 8  # bf16 elements in 16 bytes
MM_BF16 = {layout: KernelSpec("bf16", "bf16", "bf16", layout) for layout in B_LAYOUTS}
_OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16"}
BMM_FP8 = {out: KernelSpec("e4m3", "e4m3", name, "column", scaled=True)
           for out, name in _OUT_NAMES.items()}
ALL_SPECS = tuple(MM_BF16.values()) + tuple(BMM_FP8.values())


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` row-major packed with a 16-byte aligned start (a copy where it is not)."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _columns(t: torch.Tensor) -> torch.Tensor:
    """``t`` column-major packed (its transpose row-major), 16-byte aligned start."""
    return _rows(t.transpose(-1, -2)).transpose(-1, -2)


def _write_through(spec: KernelSpec, a, b, out, scales=None) -> None:
    """Launch into ``out`` when it is packed and aligned, else into a new tensor copied back."""
    target = out if out.is_contiguous() and out.data_ptr() % 16 == 0 else torch.empty_like(
        out, memory_format=torch.contiguous_format)
    runtime.launch(spec, a, b, target, scales)
    if target is not out:
        out.copy_(target)


# ------------------------------------------------------------------------------------------
# mm_bf16


def b_layout(b: torch.Tensor) -> str | None:
    """``"row"`` (``b`` row-major), ``"column"`` (``b.t()`` row-major, upstream's weight) or None
    (other strides: copied to row-major first)."""
    if b.stride(1) == 1 and (b.stride(0) == b.shape[1] or b.shape[0] == 1):
        return "row"
    if b.stride(0) == 1 and (b.stride(1) == b.shape[0] or b.shape[1] == 1):
        return "column"
    return None


def mm_bf16(a: torch.Tensor, b: torch.Tensor, bias, out: torch.Tensor) -> None:
    """``out = a @ b``: bf16, fp32 accumulation (the check keeps bias and misaligned shapes
    away)."""
    layout = b_layout(b) or "row"
    b = _columns(b) if layout == "column" else _rows(b)
    _write_through(MM_BF16[layout], _rows(a).unsqueeze(0), b.unsqueeze(0), out.unsqueeze(0))


def mm_bf16_reasons(problem) -> list[Reason]:
    shape = dict(problem.shape)
    reasons = []
    for dim in ("k", "n"):
        value = shape.get(dim)
        if isinstance(value, int) and value % _ALIGN:
            reasons.append(Reason(f"shape.{dim}", value, f"a multiple of {_ALIGN}",
                                  "the CUTLASS kernels here are built for 16-byte rows"))
    return reasons


# ------------------------------------------------------------------------------------------
# bmm_fp8


def bmm_fp8(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
            out: torch.Tensor) -> None:
    """``out[i] = A[i] @ B[i] * A_scale * B_scale`` in one launch (e4m3 operands and the k / n
    multiples: capability record)."""
    if A.dim() == 2:  # one product (mm_fp8)
        A, B, out = A[None], B[None], out[None]
    scales = (A_scale.float().reshape(1), B_scale.float().reshape(1))
    _write_through(BMM_FP8[out.dtype], _rows(A), _columns(B), out, scales)


# ------------------------------------------------------------------------------------------
# warm-up


def _check_case(spec: KernelSpec, device: torch.device, gen: torch.Generator):
    """Operands of a small GEMM for ``spec``, its output poisoned with NaN, and the float64
    result it must reach (``(args, out, want)``)."""
    batch, m, k, n = (3 if spec.scaled else 1), 64, 256, 128
    a = torch.randn(batch, m, k, device=device, generator=gen)
    w = torch.randn(batch, n, k, device=device, generator=gen)
    out_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[spec.out]
    out = torch.full((batch, m, n), float("nan"), device=device, dtype=out_dtype)
    if not spec.scaled:
        a, w = a.bfloat16(), w.bfloat16()
        b = w.transpose(1, 2) if spec.b_layout == "column" else w.transpose(1, 2).contiguous()
        want = a.double() @ b.double()
        return (mm_bf16, (a[0], b[0], None, out[0])), out, want
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    sa = torch.full((1,), 0.5, device=device)
    sb = torch.full((1,), 0.25, device=device)
    want = (a8.double() @ w8.double().transpose(1, 2)) * 0.125
    return (bmm_fp8, (a8, w8.transpose(1, 2), sa, sb, out)), out, want


def specs_for(ops) -> tuple[KernelSpec, ...]:
    """The kernels of this adapter that serve ``ops`` (of ``mm_bf16``, ``bmm_fp8``); which ops a
    device admits is its capability records' say (``flashinfer.warmup.cutlass_specs``)."""
    ops = set(ops)
    return ((tuple(MM_BF16.values()) if "mm_bf16" in ops else ())
            + (tuple(BMM_FP8.values()) if "bmm_fp8" in ops else ()))


def compile_all(specs, device: torch.device | str = "cuda") -> list[dict]:
    """Compile (or load from the disk cache) the kernels ``specs``, nvcc running in parallel,
    then run each once on a small GEMM checked against float64;
    ``[{"kernel", "seconds", "ok"}]``."""
    device = torch.device(device)
    started = time.perf_counter()
    seconds = runtime.compile_many(specs, device)
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    for spec in specs:
        (kernel, args), out, want = _check_case(spec, device, gen)
        kernel(*args)
        torch.cuda.synchronize(device)
        ok = not out.isnan().any() and torch.allclose(out.double(), want, rtol=2e-2, atol=2e-1)
        rows.append({"kernel": spec.label, "seconds": round(seconds[spec], 2), "ok": bool(ok)})
    rows.append({"kernel": "all (parallel nvcc)", "seconds":
                 round(time.perf_counter() - started, 2), "ok": all(r["ok"] for r in rows)})
    return rows
