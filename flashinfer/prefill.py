"""Single-request prefill attention (upstream module ``flashinfer.prefill``).

``single_prefill_with_kv_cache`` validates its arguments, then runs one ``torch.library`` custom op
(``torch.ops.flashinfer.single_prefill_with_kv_cache``) that builds the dispatch
:class:`~flashinfer.dispatch.Problem`, lets the dispatcher choose a kernel and calls it with the
canonical signature of :mod:`flashinfer.attention_params`. The decode module reuses the helpers
here (``single_decode`` is the same computation with one query row).

Problem facts: dtypes ``q``, ``kv``, ``o``; shape ``head_dim_qk``, ``head_dim_vo``,
``num_qo_heads``, ``num_kv_heads``, ``qo_len`` and ``kv_len`` (both bucketed to powers of two);
layout ``NHD`` / ``HND``. Features are set exactly when they change the result: ``causal`` only
when ``qo_len > 1`` and no custom mask (it hides nothing for one query row); ``window`` only when
``window_left < kv_len - 1`` (a wider window hides nothing); ``gqa`` when ``num_qo_heads !=
num_kv_heads``; ``soft_cap`` when the cap is ``> 0``; ``alibi`` / ``rope_llama`` by
``pos_encoding_mode``; ``custom_mask`` when a (packed) mask is given; ``lse`` when
``return_lse``; ``head_dim_differs``, ``kv_dtype_differs`` (k/v dtype != q dtype) and
``o_dtype_differs`` (``o_dtype`` != q dtype).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Optional

import torch

from . import dispatch, overrides
from .api_logging import flashinfer_api
from .attention_params import (LARGE_SOFTMAX_SCALE, POS_ENCODING_MODES, AttentionParams,
                               cached_alibi_slopes, check_softmax_scale)
from .custom_op import custom_op

__all__ = ["single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse"]

KV_LAYOUTS = ("NHD", "HND")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_TEXT = "float16, bfloat16, float32 (fp8 / NVFP4 inputs are not supported yet)"


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


def _number(name: str, value, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float or None, got {type(value).__name__}"
                        + (" (per-tensor scale tensors are not supported yet)"
                           if isinstance(value, torch.Tensor) else ""))
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}={value} must be finite")
    return value


def _positive(name: str, value, default: float) -> float:
    value = _number(name, value, default)
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
    cap = _number("logits_soft_cap", logits_soft_cap, 0.0)
    if cap < 0:
        raise ValueError(f"logits_soft_cap={cap} must be >= 0 (0 or None disables it)")
    scale = _number("sm_scale", sm_scale, 1.0 / math.sqrt(head_dim_qk))
    rope_scale = _positive("rope_scale", rope_scale, 1.0)
    rope_theta = _positive("rope_theta", rope_theta, 1e4)
    if mode == "ROPE_LLAMA" and head_dim_qk % 2:
        raise ValueError(f"pos_encoding_mode='ROPE_LLAMA' needs an even head_dim_qk, got {head_dim_qk}")
    overrides.resolve_spelling(backend)
    return mode, window_left, cap, scale, rope_scale, rope_theta


def unpack_mask(packed: torch.Tensor, qo_len: int, kv_len: int) -> torch.Tensor:
    """Little-endian bit-packed uint8 ``[ceil(qo_len*kv_len/8)]`` -> bool ``[qo_len, kv_len]``."""
    bits = torch.arange(8, device=packed.device, dtype=torch.uint8)
    flat = ((packed.reshape(-1, 1) >> bits) & 1).reshape(-1)
    return flat[: qo_len * kv_len].reshape(qo_len, kv_len).to(torch.bool)


def _check_mask(q, custom_mask, packed_custom_mask, qo_len: int, kv_len: int) -> Optional[torch.Tensor]:
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


def _check_o_dtype(o_dtype, q_dtype: torch.dtype) -> torch.dtype:
    if o_dtype is None:
        return q_dtype
    if isinstance(o_dtype, str):
        o_dtype = getattr(torch, o_dtype, o_dtype)
    if o_dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"o_dtype={o_dtype!r} is not supported; allowed: None (q's dtype), {_DTYPE_TEXT}")
    return o_dtype


# ------------------------------------------------------------------------------------------
# the op body shared by single_prefill and single_decode


def run_single(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               custom_mask: Optional[torch.Tensor], causal: bool, kv_layout: str,
               pos_encoding_mode: str, sm_scale: float, window_left: int, logits_soft_cap: float,
               rope_scale: float, rope_theta: float, return_lse: bool, o_dtype: torch.dtype,
               v_scale: float, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch and run one validated call; ``q`` is ``[qo_len, H_qo, D]``, k/v as given.

    Returns ``(out, lse)``; ``lse`` is an empty float32 tensor when ``return_lse`` is False.
    """
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    qo_len, num_qo_heads, head_dim_qk = q.shape
    kv_len, num_kv_heads, head_dim_vo = v.shape
    if custom_mask is not None or qo_len == 1:
        causal = False
    if window_left >= kv_len - 1:
        window_left = -1
    features = {
        "causal": causal, "gqa": num_qo_heads != num_kv_heads, "window": window_left >= 0,
        "soft_cap": logits_soft_cap > 0, "alibi": pos_encoding_mode == "ALIBI",
        "rope_llama": pos_encoding_mode == "ROPE_LLAMA", "custom_mask": custom_mask is not None,
        "lse": return_lse, "head_dim_differs": head_dim_qk != head_dim_vo,
        "kv_dtype_differs": k.dtype != q.dtype, "o_dtype_differs": o_dtype != q.dtype,
        "large_sm_scale": sm_scale > LARGE_SOFTMAX_SCALE,
    }
    problem = dispatch.Problem.make(
        op, q.device,
        dtypes={"q": q.dtype, "kv": k.dtype, "o": o_dtype},
        shape={"head_dim_qk": head_dim_qk, "head_dim_vo": head_dim_vo,
               "num_qo_heads": num_qo_heads, "num_kv_heads": num_kv_heads,
               "qo_len": dispatch.length_bucket(qo_len), "kv_len": dispatch.length_bucket(kv_len)},
        features=[name for name, used in features.items() if used],
        layout=kv_layout)
    decision = dispatch.decide(problem, backend)
    params = AttentionParams(
        sm_scale=sm_scale, causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap,
        pos_encoding_mode=pos_encoding_mode, rope_scale=rope_scale, rope_theta=rope_theta,
        custom_mask=custom_mask, return_lse=return_lse, o_dtype=o_dtype,
        alibi_slopes=(cached_alibi_slopes(num_qo_heads, q.device)
                      if pos_encoding_mode == "ALIBI" else None))
    out, lse = decision.kernel(q, k, v, params)
    if v_scale != 1.0:
        out = (out.to(torch.float32) * v_scale).to(o_dtype)
    if lse is None:
        lse = q.new_empty((0,), dtype=torch.float32)
    return out, lse


def _prefill_fake(q, k, v, custom_mask, causal, kv_layout, pos_encoding_mode, sm_scale,
                  window_left, logits_soft_cap, rope_scale, rope_theta, return_lse, o_dtype,
                  v_scale, backend):
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]), dtype=o_dtype)
    lse = q.new_empty((q.shape[0], q.shape[1]) if return_lse else (0,), dtype=torch.float32)
    return out, lse


@custom_op("single_prefill_with_kv_cache", mutates_args=(), fake=_prefill_fake)
def _single_prefill_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       custom_mask: Optional[torch.Tensor], causal: bool, kv_layout: str,
                       pos_encoding_mode: str, sm_scale: float, window_left: int,
                       logits_soft_cap: float, rope_scale: float, rope_theta: float,
                       return_lse: bool, o_dtype: torch.dtype, v_scale: float, backend: str
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    return run_single("single_prefill", q, k, v, custom_mask, causal, kv_layout, pos_encoding_mode,
                      sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta, return_lse,
                      o_dtype, v_scale, backend)


# ------------------------------------------------------------------------------------------
# public API


@flashinfer_api
def single_prefill_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale_q: Optional[torch.Tensor] = None,
    scale_k: Optional[torch.Tensor] = None,
    scale_v: Optional[torch.Tensor] = None,
    o_dtype: Optional[torch.dtype] = None,
    custom_mask: Optional[torch.Tensor] = None,
    packed_custom_mask: Optional[torch.Tensor] = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    backend: str = "auto",
    return_lse: bool = False,
    kv_cache_sf: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
):
    r"""Attention of one request's ``qo_len`` query tokens over its whole KV.

    Parameters
    ----------
    q : ``[qo_len, num_qo_heads, head_dim_qk]``, float16 / bfloat16 / float32.
    k : ``[kv_len, num_kv_heads, head_dim_qk]`` (NHD) or ``[num_kv_heads, kv_len, head_dim_qk]``
        (HND); float16 / bfloat16 / float32 (may differ from q's dtype; v must match k's).
    v : like ``k`` with last dimension ``head_dim_vo``.
    scale_q, scale_k, scale_v, kv_cache_sf : fp8 / NVFP4 quantisation inputs; not supported yet
        (a value other than None raises ``NotImplementedError``).
    o_dtype : output dtype, default q's dtype.
    custom_mask : bool ``[qo_len, kv_len]``, True = keep; replaces ``causal``.
    packed_custom_mask : uint8 ``[ceil(qo_len * kv_len / 8)]``, the row-major mask bit-packed
        little-endian (``flashinfer.packbits(mask, bitorder="little")``); wins over custom_mask.
    causal : bottom-right aligned: query ``r`` sees keys ``j <= kv_len - qo_len + r``.
    kv_layout : ``"NHD"`` or ``"HND"``.
    pos_encoding_mode : ``"NONE"``, ``"ROPE_LLAMA"`` (RoPE applied inside, q at positions
        ``kv_len - qo_len + r``) or ``"ALIBI"`` (slopes :func:`get_alibi_slopes`).
    use_fp16_qk_reduction : accepted for compatibility; a precision-lowering hint no backend here
        uses (results are as if False).
    sm_scale : default ``1 / sqrt(head_dim_qk)``; multiplied by ``k_scale`` when given.
    window_left : ``-1`` or a left window: query at position ``i`` sees keys ``j >= i - window_left``.
    logits_soft_cap : ``cap * tanh(s / cap)`` on the scaled logits when ``> 0``.
    rope_scale, rope_theta : RoPE parameters, default 1.0 and 1e4.
    backend : ``"auto"`` or a backend / alias from :mod:`flashinfer.overrides` (``"fa2"``,
        ``"fa3"``, ``"torch"``, ``"cudnn"``, ``"reference"``, ``"torch:flash_varlen"``, ...).
    return_lse : also return the base-2 log-sum-exp ``[qo_len, num_qo_heads]`` float32.
    k_scale, v_scale : float calibration scales: ``k_scale`` multiplies ``sm_scale``, ``v_scale``
        the output.

    Returns
    -------
    ``out [qo_len, num_qo_heads, head_dim_vo]`` in ``o_dtype``, and ``lse`` when ``return_lse``.
    """
    for name, value in (("scale_q", scale_q), ("scale_k", scale_k), ("scale_v", scale_v),
                        ("kv_cache_sf", kv_cache_sf)):
        if value is not None:
            raise NotImplementedError(f"{name} (fp8 / NVFP4 quantised attention) is not supported "
                                      f"yet; pass {name}=None with float16/bfloat16/float32 inputs")
    layout = check_kv_layout(kv_layout)
    qo_len, kv_len, _, _, head_dim_qk, _ = check_qkv(q, k, v, layout, 3, same_head_dim=False)
    mode, window_left, cap, scale, rope_scale, rope_theta = check_common(
        pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
        head_dim_qk, backend)
    scale *= _number("k_scale", k_scale, 1.0)
    check_softmax_scale(scale, "sm_scale * k_scale")
    out_scale = _number("v_scale", v_scale, 1.0)
    out_dtype = _check_o_dtype(o_dtype, q.dtype)
    mask = _check_mask(q, custom_mask, packed_custom_mask, qo_len, kv_len)
    out, lse = _single_prefill_op(q, k, v, mask, bool(causal), layout, mode, scale, window_left,
                                  cap, rope_scale, rope_theta, bool(return_lse), out_dtype,
                                  out_scale, backend)
    return (out, lse) if return_lse else out


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache,
                                                            return_lse=True)
single_prefill_with_kv_cache_return_lse.__doc__ = (
    "``single_prefill_with_kv_cache(..., return_lse=True)``: returns ``(out, lse)``.")

from .batch_prefill import (  # noqa: E402,F401  (upstream module name)
    BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper,
)
