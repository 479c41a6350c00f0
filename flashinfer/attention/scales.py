"""Calibration scales given as tensors (``k_scale`` / ``v_scale``, per tensor or per KV head).

A float scale folds into the softmax scale (``k_scale``) or multiplies the output (``v_scale``)
inside every kernel. A tensor scale stays on the device (no synchronisation, so a CUDA graph can
capture the call and replay it with new scale values): ``k_scale`` multiplies the query heads
of each KV head before the kernel (``q . (s k) = (s q) . k``: the same scores, so the same
output and lse; q is rounded once more to its dtype), ``v_scale`` multiplies the output heads
after it. Accepted shapes: one element (per tensor) or ``[num_kv_heads]`` (per KV head), any
float dtype, on the query's device. Their values are not read on the host, so the
``sm_scale * k_scale`` range check of float scales does not apply to them.
"""

from __future__ import annotations

import torch


def head_scales(name: str, value, num_kv_heads: int, device: torch.device) -> torch.Tensor | None:
    """``None`` when ``value`` is not a tensor, else a float32 ``[num_kv_heads]`` view of it
    (``ValueError`` naming ``name`` for another shape, dtype or device)."""
    if not isinstance(value, torch.Tensor):
        return None
    if not value.is_floating_point():
        raise ValueError(f"{name} as a tensor must be a float tensor, got {value.dtype}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but q is on {device}")
    if value.numel() == 1:
        return value.reshape(1).float().expand(num_kv_heads)
    if value.dim() != 1 or value.shape[0] != num_kv_heads:
        raise ValueError(f"{name} as a tensor must have one element or [num_kv_heads="
                         f"{num_kv_heads}] (one per KV head), got shape {tuple(value.shape)}")
    return value.float()


def per_query_head(scales: torch.Tensor, num_qo_heads: int) -> torch.Tensor:
    """``[num_kv_heads]`` -> ``[1, num_qo_heads, 1]``: each query head takes its KV head's."""
    group = num_qo_heads // scales.shape[0]
    return scales.repeat_interleave(group)[None, :, None]


def fold_k_scale(q: torch.Tensor, k_heads: torch.Tensor) -> torch.Tensor:
    """``q [tokens, H_qo, D]`` with each head multiplied by its KV head's ``k_scale`` (a new
    tensor in q's dtype)."""
    return (q.float() * per_query_head(k_heads, q.shape[1])).to(q.dtype)


def apply_v_scale(out: torch.Tensor, v_heads: torch.Tensor) -> None:
    """``out [tokens, H_qo, D]`` multiplied in place by each head's ``v_scale``."""
    out.mul_(per_query_head(v_heads, out.shape[1]).to(out.dtype))


__all__ = ["apply_v_scale", "fold_k_scale", "head_scales", "per_query_head"]
