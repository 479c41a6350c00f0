"""Upstream's public helpers (module ``flashinfer.utils``): the enums of the attention
arguments, device capability queries, upstream's own backend heuristics (so code written
against them keeps its branches), small integer helpers, the NVFP4 tensor container and the
exception classes.

The ``is_sm*_supported`` queries follow upstream's rule: the GPU's compute capability and the
CUDA toolkit torch was built with (``torch.version.cuda``; none on a CPU build, so every query is
False there). ``determine_*_backend`` answer with upstream's kernel names (``"fa3"``, ``"fa2"``,
``"sm90"``, ``"sm80"``); passed back as ``backend=`` they mean the kernels of ours they map to,
or the best available (:mod:`flashinfer.overrides`).
"""

from __future__ import annotations

import enum
import functools
from typing import Optional, Tuple

import torch

__all__ = [
    "PosEncodingMode", "MaskMode", "TensorLayout", "GPUArchitectureError", "LibraryError",
    "BackendSupportedError", "FP4Tensor", "get_compute_capability", "is_sm90a_supported",
    "is_sm100a_supported", "is_sm100f_supported", "is_sm110a_supported", "is_sm120a_supported",
    "is_sm120f_supported", "is_sm121a_supported", "is_sm12x_supported", "is_cvt_rs_supported",
    "device_support_pdl", "is_fa3_backend_supported", "is_fa3_prefill_head_dim_supported",
    "determine_attention_backend", "determine_mla_backend", "determine_gemm_backend",
    "next_positive_power_of_2", "ceil_div", "round_up",
]


class PosEncodingMode(enum.IntEnum):
    """``pos_encoding_mode``: upstream's integer codes of the string spellings."""

    NONE = 0
    ROPE_LLAMA = 1
    ALIBI = 2


class MaskMode(enum.IntEnum):
    NON_CAUSAL = 0
    CAUSAL = 1
    CUSTOM = 2
    MULTIITEMSCORING = 3


class TensorLayout(enum.IntEnum):
    """``kv_layout``: ``NHD`` = [tokens, heads, dim], ``HND`` = [heads, tokens, dim]."""

    NHD = 0
    HND = 1


class GPUArchitectureError(Exception):
    """The GPU's architecture cannot run the requested kernel."""


class LibraryError(Exception):
    """A library the requested kernel needs is missing or too old."""


class BackendSupportedError(Exception):
    """The requested backend does not support this GPU or problem."""


class FP4Tensor:
    """An NVFP4 tensor: packed e2m1 ``data``, its block ``scale`` factors, the row where this
    tensor's scales start in a shared scale buffer, and the shape before packing."""

    def __init__(self, data: torch.Tensor, scale: torch.Tensor, scale_start_index: int = 0,
                 original_shape: Optional[Tuple[int, ...]] = None):
        self.data = data
        self.scale = scale
        self.scale_start_index = scale_start_index
        self.original_shape = original_shape


# ------------------------------------------------------------------------------------------
# device queries


def _cuda_device(device) -> torch.device:
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device}")
    return device


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> Tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def get_compute_capability(device) -> Tuple[int, int]:
    """``(major, minor)`` of the CUDA ``device`` (cached per device)."""
    device = _cuda_device(device)
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


def _toolkit() -> Tuple[int, int]:
    """The CUDA toolkit torch was built with, ``(0, 0)`` on a CPU build."""
    version = torch.version.cuda
    if not version:
        return (0, 0)
    major, minor = (version.split(".") + ["0"])[:2]
    return (int(major), int(minor))


def _supported(device, cc_ok, toolkit: Tuple[int, int]) -> bool:
    if _toolkit() < toolkit:
        return False
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return cc_ok(get_compute_capability(device))


def is_sm90a_supported(device) -> bool:
    return _supported(device, lambda cc: cc[0] == 9, (12, 3))


def is_sm100a_supported(device) -> bool:
    return _supported(device, lambda cc: cc[0] == 10, (12, 8))


def is_sm100f_supported(device) -> bool:
    return _supported(device, lambda cc: cc[0] == 10, (12, 9))


def is_sm110a_supported(device) -> bool:
    return _supported(device, lambda cc: cc[0] == 11, (13, 0))


def is_sm120a_supported(device) -> bool:
    return _supported(device, lambda cc: cc == (12, 0), (12, 8))


def is_sm120f_supported(device) -> bool:
    return _supported(device, lambda cc: cc[0] == 12, (12, 9))


def is_sm121a_supported(device) -> bool:
    return _supported(device, lambda cc: cc == (12, 1), (12, 9))


def is_sm12x_supported(device) -> bool:
    return is_sm120a_supported(device) or is_sm121a_supported(device)


def is_cvt_rs_supported(device) -> bool:
    """The stochastic-rounding conversions: compute capability 10.0 and 10.3 only."""
    return _supported(device, lambda cc: cc in ((10, 0), (10, 3)), (12, 8))


def device_support_pdl(device) -> bool:
    """Programmatic dependent launch: compute capability 9.0 and newer."""
    return _supported(device, lambda cc: cc[0] >= 9, (0, 0))


# ------------------------------------------------------------------------------------------
# upstream's backend heuristics (its kernel names)

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _mode(pos_encoding_mode) -> int:
    if isinstance(pos_encoding_mode, str):
        return PosEncodingMode[pos_encoding_mode].value
    return int(pos_encoding_mode)


def is_fa3_backend_supported(pos_encoding_mode, use_fp16_qk_reductions: bool,
                             use_custom_mask: bool, dtype_q: torch.dtype,
                             dtype_kv: torch.dtype) -> bool:
    """Whether upstream's FA3 kernel serves these options: no custom mask, no positional
    encoding, no fp16 QK reduction, no fp8 KV under a non-fp8 query, no NVFP4 (uint8) KV."""
    if use_custom_mask or _mode(pos_encoding_mode) != PosEncodingMode.NONE:
        return False
    if use_fp16_qk_reductions or dtype_kv == torch.uint8:
        return False
    return not (dtype_kv in _FP8 and dtype_q not in _FP8)


def is_fa3_prefill_head_dim_supported(head_dim_qk: int, head_dim_vo: int) -> bool:
    """Equal head dims of 64, 128 or 256, or DeepSeek's 192 / 128."""
    return (head_dim_qk == head_dim_vo and head_dim_qk in (64, 128, 256)) or (
        (head_dim_qk, head_dim_vo) == (192, 128))


def determine_attention_backend(device, pos_encoding_mode, use_fp16_qk_reductions: bool,
                                use_custom_mask: bool, dtype_q: torch.dtype,
                                dtype_kv: torch.dtype, *, head_dim_qk: Optional[int] = None,
                                head_dim_vo: Optional[int] = None) -> str:
    """``"fa3"`` where upstream would run its FA3 kernel (SM 9.0a and options it serves),
    else ``"fa2"``."""
    if not is_sm90a_supported(device) or not is_fa3_backend_supported(
            pos_encoding_mode, use_fp16_qk_reductions, use_custom_mask, dtype_q, dtype_kv):
        return "fa2"
    if head_dim_qk is not None and head_dim_vo is not None and (
            not is_fa3_prefill_head_dim_supported(head_dim_qk, head_dim_vo)):
        return "fa2"
    return "fa3"


def determine_mla_backend(device) -> str:
    return "fa3" if is_sm90a_supported(device) else "fa2"


def determine_gemm_backend(device) -> str:
    """Upstream's segment-GEMM kernel family: ``"sm90"`` on SM 9.x with CUDA >= 12.3."""
    return "sm90" if is_sm90a_supported(device) else "sm80"


# ------------------------------------------------------------------------------------------
# integers


def _int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def next_positive_power_of_2(x: int) -> int:
    """The smallest power of two ``>= x``; 1 for ``x < 1``."""
    x = _int("x", x)
    return 1 if x < 1 else 1 << (x - 1).bit_length()


def ceil_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for ints, ``y > 0``."""
    x, y = _int("x", x), _int("y", y)
    if y <= 0:
        raise ValueError(f"y must be > 0, got {y}")
    return -(-x // y)


def round_up(x: int, y: int) -> int:
    """``x`` rounded up to a multiple of ``y > 0``."""
    return ceil_div(x, y) * y
