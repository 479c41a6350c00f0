"""fp8 inputs of the single-request ops (``single_decode_with_kv_cache``,
``single_prefill_with_kv_cache``), as a composition: the fp8 tensors are widened to a 16-bit
dtype (exact: every e4m3 / e5m2 value is a float16 and a bfloat16 value) and the call runs on
the plain path, where the calibration scales apply as they do for 16-bit inputs (``k_scale``
into the softmax scale, ``v_scale`` on the output; floats, or tensors of one element or one
per KV head, :mod:`.scales`). No single-request kernel here reads fp8 itself, so this costs one
widening pass over the inputs.

* fp8 KV (float8_e4m3fn / float8_e5m2, ``k`` and ``v`` alike) with a 16-/32-bit ``q``: K and V
  are widened to q's dtype.
* fp8 ``q`` (single prefill, upstream's fp8 path): ``k`` and ``v`` fp8 too; ``o_dtype``
  (float16 / bfloat16) required; the per-head dequantisation scales ``scale_q [H_qo]``,
  ``scale_k`` / ``scale_v [H_kv]`` (float32, default ones) multiply q, the scores and the
  output. q is widened as ``q * scale_q`` rounded to ``o_dtype``; ``scale_k`` / ``scale_v``
  combine with ``k_scale`` / ``v_scale``.
"""

from __future__ import annotations

import torch

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_WIDE = (torch.float16, torch.bfloat16)


def is_fp8(*tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype in FP8 for t in tensors)


def _heads_vector(name: str, t, heads: int, device) -> torch.Tensor | None:
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() not in (1, heads):
        raise ValueError(f"{name} must be a float tensor of 1 or {heads} elements (per head), "
                         f"got {getattr(t, 'dtype', type(t).__name__)} "
                         f"{tuple(getattr(t, 'shape', ()))}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    return t.reshape(-1).float().expand(heads)


def _combined(tensor: torch.Tensor | None, scale):
    """A per-head tensor scale times a float / tensor calibration scale (either may be None)."""
    if tensor is None:
        return scale
    if scale is None:
        return tensor
    return tensor * (scale.float().reshape(-1) if isinstance(scale, torch.Tensor) else float(scale))


def widen(q, k, v, kv_layout: str, q_rank: int, o_dtype, scale_q, scale_k, scale_v, k_scale,
          v_scale):
    """``(q, k, v, o_dtype, k_scale, v_scale)`` for the plain path (module docstring)."""
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)) or (
            k.dtype in FP8) != (v.dtype in FP8):
        raise ValueError("k and v must both be fp8 or both not (one KV dtype)")
    if q.dtype not in FP8:
        if scale_q is not None or scale_k is not None or scale_v is not None:
            raise ValueError("scale_q / scale_k / scale_v are the dequantisation scales of an fp8 "
                             "q path; with a 16-bit q pass k_scale / v_scale")
        return q, k.to(q.dtype), v.to(q.dtype), o_dtype, k_scale, v_scale
    if k.dtype not in FP8:
        raise ValueError("an fp8 q needs fp8 k and v (upstream's fp8 path)")
    if isinstance(o_dtype, str):
        o_dtype = getattr(torch, o_dtype, o_dtype)
    if o_dtype not in _WIDE:
        raise ValueError(f"an fp8 q needs o_dtype=torch.float16 or torch.bfloat16, got {o_dtype!r}")
    q_heads = q.shape[-2]
    kv_heads = k.shape[0] if kv_layout == "HND" else k.shape[1]
    sq = _heads_vector("scale_q", scale_q, q_heads, q.device)
    sk = _heads_vector("scale_k", scale_k, kv_heads, q.device)
    sv = _heads_vector("scale_v", scale_v, kv_heads, q.device)
    wide_q = q.float() if sq is None else q.float() * sq[:, None]
    return (wide_q.to(o_dtype), k.to(o_dtype), v.to(o_dtype), o_dtype, _combined(sk, k_scale),
            _combined(sv, v_scale))
