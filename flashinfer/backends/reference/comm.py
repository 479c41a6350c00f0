"""Reference fused all-reduce: ``torch.distributed.all_reduce`` (any process-group backend,
gloo included) of the input in fp32, then the residual add, our reference RMSNorm and the fp8
quantisations (per-tensor, per-token dynamic, per-token-group with packed UE8M0 scales).

A collective on CPU tensors waits at most ``FLASHINFER_COMM_TIMEOUT_S`` seconds for the other
ranks, then raises ``RuntimeError`` (a rank that died or stopped never hangs the others); on
GPUs the all-reduce is queued on the stream (a host wait would cost a synchronisation and break
CUDA-graph capture) and NCCL's watchdog bounds it with the process group's timeout.

Kernel signature and semantics: :mod:`flashinfer.comm.fusion` (module docstring).
"""

from __future__ import annotations

from datetime import timedelta

import torch

from ... import envs
from .norm import rmsnorm

FP8_MAX = 448.0  # float8_e4m3fn's largest finite
DYNAMIC_MIN_SCALE = float(torch.tensor(2.0 ** -9, dtype=torch.float32) / FP8_MAX)
GROUP_MIN_SCALE = 1e-10


def _to_fp8(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, saturating at +-448, rounded to nearest even (NaN stays NaN)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _dynamic_fp8(y: torch.Tensor, quant_out: torch.Tensor, scale_out: torch.Tensor) -> None:
    """Per-token scale ``s = max(amax|y| / 448, 2**-9 / 448)`` into ``scale_out [T, 1]``."""
    s = (y.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp_min(DYNAMIC_MIN_SCALE)
    scale_out.copy_(s)
    quant_out.copy_(_to_fp8(y / s))


def _group_fp8(y: torch.Tensor, quant_out: torch.Tensor, scale_out: torch.Tensor,
               group_size: int) -> None:
    """Per token and group of ``group_size`` columns: a power-of-two scale (the fp32 value
    ``max(amax / 448, 1e-10)`` with its mantissa rounded up), its exponent byte packed four to an
    int32 of the column-major ``scale_out [T, K]``, strides ``(1, M)``."""
    tokens, hidden = y.shape
    groups = hidden // group_size
    packs, padded_rows = (groups + 3) // 4, (tokens + 3) // 4 * 4
    g = y.reshape(tokens, groups, group_size)
    bits = (g.abs().amax(dim=-1) / FP8_MAX).clamp_min(GROUP_MIN_SCALE).view(torch.int32)
    bits = torch.where((bits & 0x7FFFFF) != 0, (bits + 0x800000) & 0x7F800000, bits)
    quant_out.copy_(_to_fp8(g / bits.view(torch.float32).unsqueeze(-1)).view(tokens, hidden))
    exponents = torch.zeros(tokens, 4 * packs, dtype=torch.uint8, device=y.device)
    exponents[:, :groups] = ((bits >> 23) & 0xFF).to(torch.uint8)
    scale_out.copy_(exponents.view(torch.int32))  # (byte g % 4 of int32 g // 4: little-endian)
    if packs > 1 and padded_rows > tokens:  # the rows between columns, but the last column's
        torch.as_strided(scale_out, (packs - 1, padded_rows - tokens), (padded_rows, 1),
                         scale_out.storage_offset() + tokens).zero_()


def all_reduce_bounded(t: torch.Tensor, group) -> None:
    """``torch.distributed.all_reduce(t)`` (sum, in place); on the CPU bounded in time."""
    import torch.distributed as dist

    if t.is_cuda:
        dist.all_reduce(t, group=group)
        return
    seconds = envs.COMM_TIMEOUT_S.get()
    work = dist.all_reduce(t, group=group, async_op=True)
    try:
        work.wait(timeout=timedelta(seconds=seconds))
    except RuntimeError as exc:
        raise RuntimeError(
            f"all-reduce over {dist.get_world_size(group)} ranks (this rank "
            f"{dist.get_rank(group)}) did not complete within {seconds} s "
            f"(FLASHINFER_COMM_TIMEOUT_S): another rank died, stopped, or called with another "
            f"shape; the process group is unusable now. Cause: {exc}") from exc


def allreduce_fusion(input: torch.Tensor, group, symmetric, output: torch.Tensor | None,
                     residual_in: torch.Tensor | None, residual_out: torch.Tensor | None,
                     rms_gamma: torch.Tensor | None, norm_out: torch.Tensor | None, eps: float,
                     weight_bias: float, quant: str | None, quant_out: torch.Tensor | None,
                     scale_out: torch.Tensor | None, scale_factor: torch.Tensor | float | None,
                     group_size: int) -> None:
    total = input.to(torch.float32, copy=True)  # (the caller's input is left as it is)
    all_reduce_bounded(total, group)
    if output is not None:
        output.copy_(total)
    if residual_in is None:
        return
    residual_out.copy_(total + residual_in.float())  # rounded once, as stored
    normed = norm_out if norm_out is not None else torch.empty_like(residual_out)
    rmsnorm(residual_out, rms_gamma, normed, None, eps, weight_bias)
    if quant is None:
        return
    y = normed.float()  # (the normed output as rounded to the dtype, as the kernels quantise it)
    if quant == "fp8_quant":
        if isinstance(scale_factor, torch.Tensor):
            inverse = torch.reciprocal(scale_factor)
        else:  # (a float: its fp32 reciprocal, on the host)
            inverse = float(torch.tensor(scale_factor, dtype=torch.float32).reciprocal())
        quant_out.copy_(_to_fp8(y * inverse))
    elif quant == "fp8_dynamic_quant":
        _dynamic_fp8(y, quant_out, scale_out)
    elif quant == "fp8_group_quant":
        _group_fp8(y, quant_out, scale_out, group_size)
    else:
        raise ValueError(f"unknown quantisation {quant!r}")
