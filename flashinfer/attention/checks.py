"""Argument checks of the single-request attention entry points (:mod:`flashinfer.decode`,
:mod:`flashinfer.prefill`): layouts, q/k/v shapes and dtypes, the scalar arguments, masks. Each
raises ``ValueError`` / ``TypeError`` naming the argument, what was given and what is allowed."""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from ..backend_names import resolve_spelling
from .params import POS_ENCODING_MODES

KV_LAYOUTS = ("NHD", "HND")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_TEXT = "float16, bfloat16, float32 (float8 q / k / v are widened to 16 bits first, NVFP4 is not supported)"


# ------------------------------------------------------------------------------------------
# validation (shared with flashinfer.decode)


def check_kv_layout(kv_layout) -> str:
    if not isinstance(kv_layout, str):
        raise TypeError(f"kv_layout must be a str ({' or '.join(KV_LAYOUTS)}), "
                        f"got {type(kv_layout).__name__}")
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout={kv_layout!r} is not valid; allowed: {', '.join(KV_LAYOUTS)}")
    return kv_layout


def check_pos_encoding_mode(mode) -> str:
    if not isinstance(mode, str) or mode not in POS_ENCODING_MODES:
        raise ValueError(f"pos_encoding_mode={mode!r} is not valid; allowed: "
                         f"{', '.join(POS_ENCODING_MODES)}")
    return mode


def _check_tensor(name: str, t, rank: int, shape_text: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have rank {rank} ({shape_text}), got shape {tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} dtype {t.dtype} is not supported; allowed: {_DTYPE_TEXT}")


def float_arg(name: str, value, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float or None, got {type(value).__name__}"
                        + (" (tensors are taken for k_scale / v_scale only)"
                           if isinstance(value, torch.Tensor) else ""))
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}={value} must be finite")
    return value


def positive_float_arg(name: str, value, default: float) -> float:
    value = float_arg(name, value, default)
    if value <= 0:
        raise ValueError(f"{name}={value} must be > 0")
    return value


def check_qkv(q: torch.Tensor, k, v, kv_layout: str, q_rank: int, same_head_dim: bool
              ) -> tuple[int, int, int, int, int, int]:
    """Validate q/k/v; return ``(qo_len, kv_len, H_qo, H_kv, head_dim_qk, head_dim_vo)``."""
    kv_text = "[kv_len, num_kv_heads, head_dim]" if kv_layout == "NHD" else "[num_kv_heads, kv_len, head_dim]"
    q_text = "[num_qo_heads, head_dim]" if q_rank == 2 else "[qo_len, num_qo_heads, head_dim_qk]"
    _check_tensor("q", q, q_rank, q_text)
    _check_tensor("k", k, 3, f"{kv_layout}: {kv_text}")
    _check_tensor("v", v, 3, f"{kv_layout}: {kv_text}")
    if k.dtype != v.dtype:
        raise ValueError(f"k and v must have the same dtype, got k {k.dtype} and v {v.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all tensors must "
                             f"be on one device")
    qo_len = 1 if q_rank == 2 else q.shape[0]
    num_qo_heads, head_dim_qk = q.shape[-2], q.shape[-1]
    seq_dim, head_dim = (0, 1) if kv_layout == "NHD" else (1, 0)
    kv_len, num_kv_heads = k.shape[seq_dim], k.shape[head_dim]
    if v.shape[seq_dim] != kv_len or v.shape[head_dim] != num_kv_heads:
        raise ValueError(f"k and v must have the same kv_len and num_kv_heads ({kv_layout}), got "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[-1] != head_dim_qk:
        raise ValueError(f"head_dim of k ({k.shape[-1]}) must equal head_dim of q ({head_dim_qk})")
    head_dim_vo = v.shape[-1]
    if same_head_dim and head_dim_vo != head_dim_qk:
        raise ValueError(f"head_dim of v ({head_dim_vo}) must equal head_dim of q ({head_dim_qk}) "
                         f"for decode")
    if min(qo_len, kv_len, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo) < 1:
        raise ValueError(f"empty attention problem: qo_len={qo_len}, kv_len={kv_len}, "
                         f"num_qo_heads={num_qo_heads}, num_kv_heads={num_kv_heads}, "
                         f"head_dim_qk={head_dim_qk}, head_dim_vo={head_dim_vo}; all must be >= 1")
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads})")
    return qo_len, kv_len, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo


def check_common(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
                 rope_theta, head_dim_qk: int, backend) -> tuple[str, int, float, float, float, float]:
    """Validate the scalar arguments both ops share; return them with defaults applied."""
    mode = check_pos_encoding_mode(pos_encoding_mode)
    if isinstance(window_left, bool) or not isinstance(window_left, numbers.Integral):
        raise TypeError(f"window_left must be an int, got {type(window_left).__name__}")
    window_left = int(window_left)
    if window_left < -1:
        raise ValueError(f"window_left={window_left} is not valid; use -1 (no window) or >= 0")
    cap = float_arg("logits_soft_cap", logits_soft_cap, 0.0)
    if cap < 0:
        raise ValueError(f"logits_soft_cap={cap} must be >= 0 (0 or None disables it)")
    scale = float_arg("sm_scale", sm_scale, 1.0 / math.sqrt(head_dim_qk))
    rope_scale = positive_float_arg("rope_scale", rope_scale, 1.0)
    rope_theta = positive_float_arg("rope_theta", rope_theta, 1e4)
    if mode == "ROPE_LLAMA" and head_dim_qk % 2:
        raise ValueError(f"pos_encoding_mode='ROPE_LLAMA' needs an even head_dim_qk, got {head_dim_qk}")
    resolve_spelling(backend)
    return mode, window_left, cap, scale, rope_scale, rope_theta


def unpack_mask(packed: torch.Tensor, qo_len: int, kv_len: int) -> torch.Tensor:
    """Little-endian bit-packed uint8 ``[ceil(qo_len*kv_len/8)]`` -> bool ``[qo_len, kv_len]``."""
    bits = torch.arange(8, device=packed.device, dtype=torch.uint8)
    flat = ((packed.reshape(-1, 1) >> bits) & 1).reshape(-1)
    return flat[: qo_len * kv_len].reshape(qo_len, kv_len).to(torch.bool)


def check_mask(q, custom_mask, packed_custom_mask, qo_len: int, kv_len: int) -> Optional[torch.Tensor]:
    if packed_custom_mask is not None:
        if not isinstance(packed_custom_mask, torch.Tensor):
            raise TypeError(f"packed_custom_mask must be a torch.Tensor, "
                            f"got {type(packed_custom_mask).__name__}")
        need = (qo_len * kv_len + 7) // 8
        if packed_custom_mask.dtype != torch.uint8 or packed_custom_mask.dim() != 1 \
                or packed_custom_mask.shape[0] != need:
            raise ValueError(f"packed_custom_mask must be uint8 [{need}] (qo_len*kv_len={qo_len * kv_len} "
                             f"bits, little-endian), got {packed_custom_mask.dtype} "
                             f"{tuple(packed_custom_mask.shape)}")
        if packed_custom_mask.device != q.device:
            raise ValueError(f"packed_custom_mask is on {packed_custom_mask.device} but q is on {q.device}")
        return unpack_mask(packed_custom_mask, qo_len, kv_len)
    if custom_mask is None:
        return None
    if not isinstance(custom_mask, torch.Tensor):
        raise TypeError(f"custom_mask must be a torch.Tensor, got {type(custom_mask).__name__}")
    if custom_mask.dtype != torch.bool:
        raise ValueError(f"custom_mask must be a bool tensor (True = keep), got {custom_mask.dtype}")
    if tuple(custom_mask.shape) != (qo_len, kv_len):
        raise ValueError(f"custom_mask must have shape [qo_len, kv_len] = [{qo_len}, {kv_len}], "
                         f"got {tuple(custom_mask.shape)}")
    if custom_mask.device != q.device:
        raise ValueError(f"custom_mask is on {custom_mask.device} but q is on {q.device}")
    return custom_mask


def check_o_dtype(o_dtype, q_dtype: torch.dtype) -> torch.dtype:
    if o_dtype is None:
        return q_dtype
    if isinstance(o_dtype, str):
        o_dtype = getattr(torch, o_dtype, o_dtype)
    if o_dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"o_dtype={o_dtype!r} is not supported; allowed: None (q's dtype), {_DTYPE_TEXT}")
    return o_dtype
