"""fp8 quantisation helpers (upstream module ``flashinfer.quantization``, fp8 part).

Every helper returns ``(x_q, scale)`` with *dequantisation* scales: ``x ~= x_q.float() * scale``
broadcast over its block, ``scale = max(amax(block), eps) / fp8_max`` in fp32 (``fp8_max`` is 448
for float8_e4m3fn, 57344 for float8_e5m2, 127 for int8), the quantised value
``clamp(x / scale, -fp8_max, fp8_max)`` rounded to the destination dtype. These are the
scales :func:`flashinfer.gemm.bmm_fp8` (per tensor), :func:`flashinfer.gemm.gemm_fp8_nt_groupwise`
(row-wise, 1x128, 128x128) consume.

* ``per_token_group_quant_8bit`` — upstream's name and signature: groups of ``group_size`` along
  the last dimension (``group_size = 128`` gives DeepSeek-V3's 1x128 activation scales).
* ``quantize_fp8_per_tensor``, ``quantize_fp8_per_token``, ``quantize_fp8_blockwise`` — ours
  (upstream has no public per-tensor / 128x128 quantiser; its docs use a ``to_float8`` snippet):
  one scale per tensor, per row, or per ``(bm, bk)`` block of a 2-D tensor (the last block of a
  dimension may be partial, so K or M need not be multiples of the block).

All run as plain torch ops on any device (this is the reference implementation; FP4 lives
elsewhere). They write fresh tensors only (no ``out=`` argument, so no aliasing to check).

Values: ``eps`` must be a finite number > 0 (``ValueError`` naming it otherwise: NaN would make
every scale NaN, 0 would divide an all-zero block by 0). NaN in a block makes its scale NaN
(NaN in, NaN out: every dequantised element of the block is NaN); inf makes it inf (the block
dequantises to NaN: ``0 * inf`` and ``inf / inf``). int8 has no NaN: such elements are stored
as 0 (their scale is NaN or inf, so they still dequantise to NaN). A tensor with an empty
dimension gives empty results (for ``quantize_fp8_per_tensor``, the scale ``eps / fp8_max``;
for ``quantize_fp8_per_token`` with ``k = 0``, ``[m, 1]`` scales of that value).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ..backend_names import family_spelling
__all__ = ["per_token_group_quant_8bit", "quantize_fp8_per_tensor", "quantize_fp8_per_token",
           "quantize_fp8_blockwise"]

_DST = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
_SOURCES = (torch.float32, torch.float16, torch.bfloat16)


def _max_of(dtype: torch.dtype) -> float:
    return float(torch.iinfo(dtype).max if dtype == torch.int8 else torch.finfo(dtype).max)


def _check_input(x, rank: Optional[int] = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _SOURCES:
        raise ValueError(f"x has unsupported dtype {x.dtype}; allowed: float32, float16, bfloat16")
    if rank is not None and x.dim() != rank:
        raise ValueError(f"x must be {rank}-D, got shape {tuple(x.shape)}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension")
    return x


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not 0 < eps < math.inf:  # also rejects NaN
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    return float(eps)


def _check_dst(dtype) -> torch.dtype:
    if dtype not in _DST:
        raise ValueError(f"dtype {dtype} is not supported; allowed: float8_e4m3fn, float8_e5m2, "
                         "int8")
    return dtype


def _cast(scaled: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    limit = _max_of(dtype)
    if dtype == torch.int8:  # int8 has no NaN: stored as 0 (its block's scale is NaN or inf)
        return torch.nan_to_num(scaled, nan=0.0).clamp(-limit, limit).round().to(dtype)
    return scaled.clamp(-limit, limit).to(dtype)


def _blocks(x: torch.Tensor, bm: int, bk: int) -> tuple[torch.Tensor, int, int]:
    """Zero-pad a 2-D fp32 tensor to whole blocks -> ``[Mb, bm, Kb, bk]`` view and the sizes."""
    m, k = x.shape
    mb, kb = -(-m // bm), -(-k // bk)
    padded = torch.nn.functional.pad(x, (0, kb * bk - k, 0, mb * bm - m))
    return padded.view(mb, bm, kb, bk), mb, kb


def quantize_fp8_blockwise(x: torch.Tensor, block_size: Tuple[int, int] = (1, 128),
                           dtype: torch.dtype = torch.float8_e4m3fn,
                           eps: float = 1e-10) -> Tuple[torch.Tensor, torch.Tensor]:
    """2-D ``x [m, k]`` -> ``(x_q [m, k], scale [ceil(m/bm), ceil(k/bk)] fp32)``.

    ``block_size = (1, 128)`` gives 1x128 activation scales, ``(128, 128)`` 128x128 weight scales.
    """
    _check_input(x, 2)
    _check_dst(dtype)
    eps = _check_eps(eps)
    if (not isinstance(block_size, (tuple, list)) or len(block_size) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                       for v in block_size)):
        raise ValueError(f"block_size must be two positive ints (rows, cols), got {block_size!r}")
    bm, bk = block_size
    m, k = x.shape
    blocks, mb, kb = _blocks(x.float(), bm, bk)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(eps) / _max_of(dtype)
    scaled = (blocks / scale[:, None, :, None]).reshape(mb * bm, kb * bk)[:m, :k]
    return _cast(scaled, dtype), scale


def quantize_fp8_per_token(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
                           eps: float = 1e-10) -> Tuple[torch.Tensor, torch.Tensor]:
    """2-D ``x [m, k]`` -> ``(x_q, scale [m, 1] fp32)``: one scale per row (row-wise)."""
    _check_input(x, 2)
    if x.shape[1] == 0:  # one (empty) block per row all the same: scale eps / fp8_max
        _check_dst(dtype)
        scale = torch.full((x.shape[0], 1), _check_eps(eps) / _max_of(dtype),
                           dtype=torch.float32, device=x.device)
        return torch.empty(x.shape, dtype=dtype, device=x.device), scale
    return quantize_fp8_blockwise(x, (1, x.shape[1]), dtype, eps)


def quantize_fp8_per_tensor(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
                            eps: float = 1e-10) -> Tuple[torch.Tensor, torch.Tensor]:
    """Any-rank ``x`` -> ``(x_q, scale)`` with ``scale`` an fp32 0-d tensor (per-tensor)."""
    _check_input(x)
    _check_dst(dtype)
    eps = _check_eps(eps)
    xf = x.float()
    amax = xf.abs().amax() if xf.numel() else xf.new_zeros(())
    scale = amax.clamp_min(eps) / _max_of(dtype)
    return _cast(xf / scale, dtype), scale


def per_token_group_quant_8bit(x: torch.Tensor, group_size: int, eps: float = 1e-10,
                               dst_dtype: Optional[torch.dtype] = None,
                               column_major_scales: bool = False,
                               scale_tma_aligned: bool = False, scale_ue8m0: bool = False,
                               backend: str = "cutile") -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x [..., h]`` in groups of ``group_size`` along the last dimension (which must be
    a multiple of it) -> ``(x_q [..., h], x_s [..., h // group_size] fp32)``.

    ``dst_dtype``: float8_e4m3fn (default), float8_e5m2 or int8. ``column_major_scales``: ``x_s``
    stored column-major (same logical shape); with ``scale_tma_aligned`` its row count is padded
    to a multiple of 4 in storage (16-byte TMA rows). ``scale_ue8m0=True`` (packed UE8M0 scales)
    is not supported. ``backend``: upstream's ``"cutile"`` and ours (``"auto"``, ``"torch"``,
    ``"reference"``) all run this torch implementation.
    """
    _check_input(x)
    dtype = _check_dst(torch.float8_e4m3fn if dst_dtype is None else dst_dtype)
    eps = _check_eps(eps)
    if (not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0
            or x.shape[-1] % group_size):
        raise ValueError(f"group_size must be a positive divisor of x.shape[-1] = "
                         f"{x.shape[-1]}, got {group_size!r}")
    if scale_ue8m0:
        raise ValueError("scale_ue8m0=True (packed UE8M0 scales) is not supported; use fp32 "
                         "scales (scale_ue8m0=False)")
    if column_major_scales and x.dim() != 2:
        raise ValueError(f"column_major_scales needs a 2-D x, got shape {tuple(x.shape)}")
    family_spelling("fp8_quantization", backend)
    lead, h = x.shape[:-1], x.shape[-1]
    groups = x.float().reshape(math.prod(lead), h // group_size, group_size)
    scale = groups.abs().amax(-1).clamp_min(eps) / _max_of(dtype)
    x_q = _cast(groups / scale.unsqueeze(-1), dtype).reshape(x.shape)
    if column_major_scales:
        rows = scale.shape[0]
        storage_rows = -(-rows // 4) * 4 if scale_tma_aligned else rows
        buf = torch.empty(scale.shape[1], storage_rows, dtype=torch.float32, device=x.device)
        buf[:, :rows] = scale.t()
        return x_q, buf[:, :rows].t()
    return x_q, scale.reshape(*lead, h // group_size)
