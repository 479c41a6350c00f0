"""Argument checks the GEMM entry points share (:mod:`flashinfer.gemm.dense`,
:mod:`flashinfer.gemm.grouped`): operand and scale tensors, output buffers, scale granularity,
upstream backend names. Metadata only, so they run on fake tensors while tracing too; each
raises ``ValueError`` / ``TypeError`` naming the argument, what was given and what is allowed.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..backend_names import family_spelling

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_OUT = (torch.bfloat16, torch.float16)
BF16_OUT = (torch.bfloat16, torch.float16, torch.float32)

def dtype_names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def tensor_arg(name: str, t, rank: int, dtypes, device=None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has unsupported dtype {t.dtype}; allowed: {dtype_names(dtypes)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but a is on {device}")
    return t


def out_dtype_arg(name: str, dtype, allowed) -> torch.dtype:
    if dtype not in allowed:
        raise ValueError(f"{name}={dtype} is not supported; allowed: {dtype_names(allowed)}")
    return dtype


def output_arg(out, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out shape mismatch: expected {shape}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise ValueError(f"out dtype mismatch: expected {dtype}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"out is on {out.device} but a is on {device}")
    if not out.is_contiguous():
        raise ValueError(f"out must be contiguous (row-major), got strides {out.stride()}")
    return out


def scalar_scale_arg(name: str, t, device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a float32 torch.Tensor with one element, "
                        f"got {type(t).__name__}")
    if t.dtype != torch.float32 or t.numel() != 1:
        raise ValueError(f"{name} must be a float32 tensor with one element (a per-tensor "
                         f"scale), got dtype {t.dtype}, shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but a is on {device}")
    return t


def backend_arg(backend) -> str:
    """Upstream's GEMM ``backend=`` spellings as the dispatcher takes them
    (:data:`flashinfer.backend_names.FAMILY_ALIASES`)."""
    return family_spelling("gemm", backend)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def granularity_arg(value) -> tuple[int, int, int]:
    if (not isinstance(value, (tuple, list)) or len(value) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ValueError(f"scale_granularity_mnk must be three positive ints (m, n, k), "
                         f"got {value!r}")
    return tuple(value)


def block_scale_arg(name: str, t, rows: int, blocks_k: int, mode: Optional[str],
                 device) -> torch.Tensor:
    """Check a groupwise scale and return it as the logical ``[rows, blocks_k]`` view."""
    expected = (blocks_k, rows) if mode == "MN" else (rows, blocks_k)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise ValueError(f"{name} has unsupported dtype {t.dtype}; allowed: float32")
    if tuple(t.shape) != expected:
        raise ValueError(f"{name} must have shape {expected} (scale_major_mode="
                         f"{mode!r}), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but a is on {device}")
    return t.t() if mode == "MN" else t


def scale_feature(granularity: tuple[int, int, int], k: int) -> str:
    gm, gn, gk = granularity
    if gm == 1 and gn == 1 and gk >= k:
        return "scale_rowwise"
    return {(1, 128, 128): "scale_1x128",
            (128, 128, 128): "scale_128x128"}.get(granularity, "scale_groupwise")


def no_output(*args, **kwargs) -> None:
    """Fake impl of the ops below: they only write into ``out``."""
    return None


def empty_k(out: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
    """``k = 0``: every dot product is empty, ``out = 0`` (plus ``bias``); the chosen kernel is
    not launched (vendor GEMMs differ on whether they accept it) and no scale is read."""
    if bias is None:
        out.zero_()
    else:
        out.copy_(bias.expand(out.shape))
