"""cuDNN matmul graphs for the GEMM family: build, cache, execute. Imports ``cudnn``.

Imported lazily from the registered kernels (``backends/cudnn/gemm.py``). One graph per exact
call geometry — batch, M, N, K, the operands' strides and dtypes, bias, output dtype — in an LRU
cache, built by ``_graphs.build_plans`` (heuristic mode A only), so a new M builds a new graph:
the capability record says so, and the dispatcher's order keeps cuBLAS first (measured on the
H200).

* ``mm``: ``out [M, N] = a [M, K] @ b [K, N] (+ bias [N])``, bf16 operands, float32
  accumulation, output bf16 / fp16 / fp32 (one 3-D graph with batch 1, bias a pointwise add);
* ``bmm_fp8``: ``out[i] = (A[i] @ B[i]) * A_scale * B_scale``, fp8 operands (e4m3 / e5m2),
  float32 accumulation, the two per-tensor scales two pointwise multiplies by [1, 1, 1] float32
  tensors read on the device (so the graph is capturable and the scales may change), bf16 /
  fp16 output.
"""

from __future__ import annotations

from dataclasses import dataclass

import cudnn
import torch

from ._graphs import _binding, _workspace, build_plans
from .single_calls import GraphCache

GEMM_CACHE = GraphCache(maxsize=256)

_DTYPES = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF,
           torch.float32: cudnn.data_type.FLOAT, torch.float8_e4m3fn: cudnn.data_type.FP8_E4M3,
           torch.float8_e5m2: cudnn.data_type.FP8_E5M2}


@dataclass(frozen=True)
class GemmKey:
    """Everything a matmul graph is built for (3-D operands ``[batch, rows, cols]``)."""

    device_index: int
    a: tuple  # (shape, stride, dtype) of each operand
    b: tuple
    out: tuple
    bias: bool
    scaled: bool  # two per-tensor scales (fp8)

    def describe(self) -> str:
        return (f"A {self.a[0]} {self.a[2]}, B {self.b[0]} {self.b[2]} -> {self.out[0]} "
                f"{self.out[2]}{', bias' if self.bias else ''}{', scaled' if self.scaled else ''}")


@dataclass(frozen=True)
class Entry:
    graph: object
    handles: dict  # name -> cudnn tensor (the variant-pack keys)
    workspace_size: int


def _operand(t: torch.Tensor) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.dtype


def _declare(key: GemmKey, handle) -> tuple[object, dict]:
    g = cudnn.pygraph(io_data_type=_DTYPES[key.out[2]],
                      intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    h = {name: g.tensor(name=name, dim=list(shape), stride=list(stride), data_type=_DTYPES[dtype])
         for name, (shape, stride, dtype) in (("a", key.a), ("b", key.b))}
    c = g.matmul(name="mm", A=h["a"], B=h["b"], compute_data_type=cudnn.data_type.FLOAT)
    c.set_data_type(cudnn.data_type.FLOAT)
    if key.scaled:
        for name in ("scale_a", "scale_b"):
            h[name] = g.tensor(name=name, dim=[1, 1, 1], stride=[1, 1, 1],
                               data_type=cudnn.data_type.FLOAT)
            c = g.mul(name=f"mul_{name}", a=c, b=h[name], compute_data_type=cudnn.data_type.FLOAT)
            c.set_data_type(cudnn.data_type.FLOAT)
    if key.bias:
        n = key.out[0][2]
        h["bias"] = g.tensor(name="bias", dim=[1, 1, n], stride=[n, n, 1],
                             data_type=cudnn.data_type.BFLOAT16)
        c = g.add(name="add_bias", a=c, b=h["bias"], compute_data_type=cudnn.data_type.FLOAT)
    shape, stride, dtype = key.out
    c.set_output(True).set_dim(list(shape)).set_stride(list(stride)).set_data_type(_DTYPES[dtype])
    h["out"] = c
    return g, h


def _build(key: GemmKey, handle) -> Entry:
    try:
        g, handles = _declare(key, handle)
        size = build_plans(g)
    except Exception as exc:  # noqa: BLE001 - re-raised with the graph named
        raise RuntimeError(f"cuDNN cannot build a matmul graph for {key.describe()}: "
                           f"{type(exc).__name__}: {exc}") from exc
    return Entry(g, handles, size)


def _run(key: GemmKey, tensors: dict[str, torch.Tensor], device: torch.device) -> None:
    bound = _binding(device.index)
    entry = GEMM_CACHE.get(("gemm", key), lambda: _build(key, bound.handle))
    pack = {entry.handles[name]: t for name, t in tensors.items()}
    entry.graph.execute(pack, _workspace(bound, device, entry.workspace_size), handle=bound.handle)


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """``out [M, N] = a [M, K] @ b [K, N] (+ bias [N])`` (views of any strides)."""
    a3, b3, o3 = a.unsqueeze(0), b.unsqueeze(0), out.unsqueeze(0)
    key = GemmKey(a.device.index, _operand(a3), _operand(b3), _operand(o3), bias is not None, False)
    tensors = {"a": a3, "b": b3, "out": o3}
    if bias is not None:
        tensors["bias"] = bias.contiguous().view(1, 1, -1)
    with torch.cuda.device(a.device):
        _run(key, tensors, a.device)


def bmm_fp8(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
            out: torch.Tensor) -> None:
    """``out[i] = (A[i] @ B[i]) * A_scale * B_scale``: ``A [b, m, k]``, ``B [b, k, n]`` fp8."""
    key = GemmKey(A.device.index, _operand(A), _operand(B), _operand(out), False, True)
    tensors = {"a": A, "b": B, "out": out,
               "scale_a": A_scale.float().reshape(1, 1, 1), "scale_b": B_scale.float().reshape(1, 1, 1)}
    with torch.cuda.device(A.device):
        _run(key, tensors, A.device)
