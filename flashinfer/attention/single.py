"""Single-request attention: ``single_prefill_with_kv_cache`` (upstream module
``flashinfer.prefill``) and ``single_decode_with_kv_cache`` (``flashinfer.decode``).

Each validates its arguments (:mod:`flashinfer.attention.checks`), then runs one
``torch.library`` custom op (``torch.ops.flashinfer.single_prefill_with_kv_cache`` /
``..._decode_...``) whose body, :func:`run_single`, builds the dispatch
:class:`~flashinfer.dispatch.Problem`, lets the dispatcher choose a kernel and calls it with the
canonical signature of :mod:`flashinfer.attention.params`. Decode is the same computation with
one query row (op ``single_decode``, never ``causal``; the kernel receives ``q`` as
``[1, num_qo_heads, head_dim]``).

Problem facts: dtypes ``q``, ``kv``, ``o``; shape ``head_dim_qk``, ``head_dim_vo``,
``num_qo_heads``, ``num_kv_heads``, ``qo_len`` and ``kv_len`` (both bucketed to powers of two);
layout ``NHD`` / ``HND``. Features are set exactly when they change the result: ``causal`` only
when ``qo_len > 1`` and no custom mask (it hides nothing for one query row); ``window`` only when
``window_left < kv_len - 1`` (a wider window hides nothing); ``gqa`` when ``num_qo_heads !=
num_kv_heads``; ``soft_cap`` when the cap is ``> 0``; ``alibi`` / ``rope_llama`` by
``pos_encoding_mode``; ``custom_mask`` when a (packed) mask is given; ``lse`` when
``return_lse``; ``head_dim_differs``, ``kv_dtype_differs`` (k/v dtype != q dtype) and
``o_dtype_differs`` (``o_dtype`` != q dtype); ``large_sm_scale`` when the softmax scale is above
``LARGE_SOFTMAX_SCALE``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

from .. import dispatch
from ..api_logging import flashinfer_api
from ..checked_calls import CheckedCalls, tensor_fact
from ..custom_op import custom_op
from . import fp8_single, positions
from .checks import check_common, check_kv_layout, check_mask, check_o_dtype, check_qkv, float_arg
from .params import LARGE_SOFTMAX_SCALE, AttentionParams, cached_alibi_slopes, check_softmax_scale
from .scales import apply_v_scale, fold_k_scale, head_scales

__all__ = ["single_decode_with_kv_cache", "single_prefill_with_kv_cache",
           "single_prefill_with_kv_cache_return_lse"]

# ------------------------------------------------------------------------------------------
# the op body shared by single_prefill and single_decode


def prepare_single(op: str, device: torch.device, q_dtype: torch.dtype, kv_dtype: torch.dtype,
                   qo_len: int, kv_len: int, num_qo_heads: int, num_kv_heads: int,
                   head_dim_qk: int, head_dim_vo: int, has_mask: bool, causal: bool,
                   kv_layout: str, pos_encoding_mode: str, sm_scale: float, window_left: int,
                   logits_soft_cap: float, rope_scale: float, rope_theta: float,
                   return_lse: bool, o_dtype: torch.dtype) -> tuple:
    """What a validated call of these facts dispatches on and passes its kernel, built from
    metadata and scalars only (so a caller may keep it for calls of the same facts):
    ``(key, make_problem, params, plain)`` — the first three for
    :func:`~flashinfer.dispatch.decide_keyed` and the kernel (``params.custom_mask`` is
    ``None``: a call with a mask sets it); ``plain``: for ``ROPE_LLAMA``, the same triple with
    ``pos_encoding_mode="NONE"`` (the rotation path, :mod:`.positions`), else ``None``."""
    if has_mask or qo_len == 1:
        causal = False
    if window_left >= kv_len - 1:
        window_left = -1
    qo_bucket, kv_bucket = dispatch.length_bucket(qo_len), dispatch.length_bucket(kv_len)
    large_scale = sm_scale > LARGE_SOFTMAX_SCALE

    def make_problem() -> dispatch.Problem:
        features = {
            "causal": causal, "gqa": num_qo_heads != num_kv_heads, "window": window_left >= 0,
            "soft_cap": logits_soft_cap > 0, "alibi": pos_encoding_mode == "ALIBI",
            "rope_llama": pos_encoding_mode == "ROPE_LLAMA", "custom_mask": has_mask,
            "lse": return_lse, "head_dim_differs": head_dim_qk != head_dim_vo,
            "kv_dtype_differs": kv_dtype != q_dtype, "o_dtype_differs": o_dtype != q_dtype,
            "large_sm_scale": large_scale,
        }
        return dispatch.Problem.make(
            op, device,
            dtypes={"q": q_dtype, "kv": kv_dtype, "o": o_dtype},
            shape={"head_dim_qk": head_dim_qk, "head_dim_vo": head_dim_vo,
                   "num_qo_heads": num_qo_heads, "num_kv_heads": num_kv_heads,
                   "qo_len": qo_bucket, "kv_len": kv_bucket},
            features=[name for name, used in features.items() if used],
            layout=kv_layout)

    key = (op, device, q_dtype, kv_dtype, o_dtype, head_dim_qk, head_dim_vo, num_qo_heads,
           num_kv_heads, qo_bucket, kv_bucket, causal, window_left >= 0, logits_soft_cap > 0,
           pos_encoding_mode, has_mask, return_lse, large_scale, kv_layout)
    params = AttentionParams(
        sm_scale=sm_scale, causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap,
        pos_encoding_mode=pos_encoding_mode, rope_scale=rope_scale, rope_theta=rope_theta,
        return_lse=return_lse, o_dtype=o_dtype,
        alibi_slopes=(cached_alibi_slopes(num_qo_heads, device)
                      if pos_encoding_mode == "ALIBI" else None))
    plain = None
    if pos_encoding_mode == "ROPE_LLAMA":
        plain = prepare_single(op, device, q_dtype, kv_dtype, qo_len, kv_len, num_qo_heads,
                               num_kv_heads, head_dim_qk, head_dim_vo, has_mask, causal,
                               kv_layout, "NONE", sm_scale, window_left, logits_soft_cap,
                               rope_scale, rope_theta, return_lse, o_dtype)[:3]
    return key, make_problem, params, plain


def run_single(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               custom_mask: Optional[torch.Tensor], causal: bool, kv_layout: str,
               pos_encoding_mode: str, sm_scale: float, window_left: int, logits_soft_cap: float,
               rope_scale: float, rope_theta: float, return_lse: bool, o_dtype: torch.dtype,
               v_scale: float, backend: str, prepared: tuple | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dispatch and run one validated call; ``q`` is ``[qo_len, H_qo, D]``, k/v as given.
    ``prepared``: this call's :func:`prepare_single`, when the caller kept it.

    Returns ``(out, lse)``; ``lse`` is ``None`` when ``return_lse`` is False.
    """
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    if prepared is None:
        qo_len, num_qo_heads, head_dim_qk = q.shape
        kv_len, num_kv_heads, head_dim_vo = v.shape
        prepared = prepare_single(
            op, q.device, q.dtype, k.dtype, qo_len, kv_len, num_qo_heads, num_kv_heads,
            head_dim_qk, head_dim_vo, custom_mask is not None, causal, kv_layout,
            pos_encoding_mode, sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
            return_lse, o_dtype)
    return run_prepared(q, k, v, custom_mask, v_scale, o_dtype, backend, prepared)


def run_prepared(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 custom_mask: Optional[torch.Tensor], v_scale: float, o_dtype: torch.dtype,
                 backend: str, prepared: tuple) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`run_single` once the call is prepared: ``k`` / ``v`` are ``[kv_len, H_kv, D]``
    (NHD) views."""
    key, make_problem, params, plain = prepared
    if plain is None:
        decision = dispatch.decide_keyed(key, make_problem, backend)
    else:  # ROPE_LLAMA: on rotated copies of q and k unless the kernel rotates (.positions)
        decision, rotate_first = positions.choose((key, make_problem), plain[:2], backend)
        if rotate_first:
            qo_len, kv_len = q.shape[0], k.shape[0]
            q = positions.rotate(q, torch.arange(kv_len - qo_len, kv_len, device=q.device),
                                 params.rope_scale, params.rope_theta)
            k = positions.rotate(k, torch.arange(kv_len, device=k.device), params.rope_scale,
                                 params.rope_theta)
            params = plain[2]
        dispatch.record(decision)  # the kernel that runs, after the consulted ones
    if custom_mask is not None:
        params = dataclasses.replace(params, custom_mask=custom_mask)
    out, lse = decision.kernel(q, k, v, params)
    if v_scale != 1.0:
        out = (out.to(torch.float32) * v_scale).to(o_dtype)
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
    out, lse = run_single("single_prefill", q, k, v, custom_mask, causal, kv_layout,
                          pos_encoding_mode, sm_scale, window_left, logits_soft_cap, rope_scale,
                          rope_theta, return_lse, o_dtype, v_scale, backend)
    return out, (q.new_empty((0,), dtype=torch.float32) if lse is None else lse)


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
    scale_q, scale_k, scale_v : float32 per-head dequantisation scales (``[H_qo]``, ``[H_kv]``,
        default ones) of the fp8 q path (q, k, v float8_e4m3fn / e5m2; ``o_dtype`` float16 or
        bfloat16 required): :mod:`flashinfer.attention.fp8_single`. fp8 k / v with a 16-bit q
        take ``k_scale`` / ``v_scale``.
    kv_cache_sf : NVFP4 KV scales; not supported yet (``NotImplementedError``).
    o_dtype : output dtype, default q's dtype.
    custom_mask : bool ``[qo_len, kv_len]``, True = keep; replaces ``causal``.
    packed_custom_mask : uint8 ``[ceil(qo_len * kv_len / 8)]``, the row-major mask bit-packed
        little-endian (``flashinfer.packbits(mask, bitorder="little")``); wins over custom_mask.
    causal : bottom-right aligned: query ``r`` sees keys ``j <= kv_len - qo_len + r``.
    kv_layout : ``"NHD"`` or ``"HND"``.
    pos_encoding_mode : ``"NONE"``, ``"ROPE_LLAMA"`` (RoPE on q at positions
        ``kv_len - qo_len + r`` and on k at ``j``: inside the reference, else on rotated copies
        before the plain kernel, :mod:`flashinfer.attention.positions`) or ``"ALIBI"`` (slopes
        :func:`get_alibi_slopes`).
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
    if kv_cache_sf is not None:
        raise NotImplementedError("kv_cache_sf (NVFP4 KV) is not supported yet")
    if fp8_single.is_fp8(q, k, v) or scale_q is not None or scale_k is not None or scale_v is not None:
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
        q, k, v, o_dtype, k_scale, v_scale = fp8_single.widen(
            q, k, v, check_kv_layout(kv_layout), 3, o_dtype, scale_q, scale_k, scale_v, k_scale,
            v_scale)
    layout = check_kv_layout(kv_layout)
    qo_len, kv_len, _, _, head_dim_qk, _ = check_qkv(q, k, v, layout, 3, same_head_dim=False)
    if isinstance(k_scale, torch.Tensor) or isinstance(v_scale, torch.Tensor):
        return _tensor_scaled(single_prefill_with_kv_cache, q, k, v, layout, 3, k_scale, v_scale,
                              return_lse, dict(
                                  o_dtype=o_dtype, custom_mask=custom_mask,
                                  packed_custom_mask=packed_custom_mask, causal=causal,
                                  kv_layout=kv_layout, pos_encoding_mode=pos_encoding_mode,
                                  sm_scale=sm_scale, window_left=window_left,
                                  logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
                                  rope_theta=rope_theta, backend=backend))
    mode, window_left, cap, scale, rope_scale, rope_theta = check_common(
        pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
        head_dim_qk, backend)
    scale *= float_arg("k_scale", k_scale, 1.0)
    check_softmax_scale(scale, "sm_scale * k_scale")
    out_scale = float_arg("v_scale", v_scale, 1.0)
    out_dtype = check_o_dtype(o_dtype, q.dtype)
    mask = check_mask(q, custom_mask, packed_custom_mask, qo_len, kv_len)
    out, lse = _single_prefill_op(q, k, v, mask, bool(causal), layout, mode, scale, window_left,
                                  cap, rope_scale, rope_theta, bool(return_lse), out_dtype,
                                  out_scale, backend)
    return (out, lse) if return_lse else out


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache,
                                                            return_lse=True)
single_prefill_with_kv_cache_return_lse.__doc__ = (
    "``single_prefill_with_kv_cache(..., return_lse=True)``: returns ``(out, lse)``.")



# ------------------------------------------------------------------------------------------
# single decode


def _decode_fake(q, k, v, kv_layout, pos_encoding_mode, sm_scale, window_left, logits_soft_cap,
                 rope_scale, rope_theta, return_lse, v_scale, backend):
    out = q.new_empty((q.shape[0], v.shape[-1]))
    lse = q.new_empty((q.shape[0],) if return_lse else (0,), dtype=torch.float32)
    return out, lse


@custom_op("single_decode_with_kv_cache", mutates_args=(), fake=_decode_fake)
def _single_decode_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layout: str,
                      pos_encoding_mode: str, sm_scale: float, window_left: int,
                      logits_soft_cap: float, rope_scale: float, rope_theta: float,
                      return_lse: bool, v_scale: float, backend: str
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = run_single("single_decode", q.unsqueeze(0), k, v, None, False, kv_layout,
                          pos_encoding_mode, sm_scale, window_left, logits_soft_cap, rope_scale,
                          rope_theta, return_lse, q.dtype, v_scale, backend)
    return out.squeeze(0), (q.new_empty((0,), dtype=torch.float32) if lse is None
                            else lse.squeeze(0))


@flashinfer_api
def single_decode_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    return_lse: bool = False,
    backend: str = "auto",
):
    r"""Decode attention of one query token per head over one request's KV.

    Parameters
    ----------
    q : ``[num_qo_heads, head_dim]``, float16 / bfloat16 / float32.
    k, v : ``[kv_len, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, kv_len, head_dim]``
        (HND), float16 / bfloat16 / float32 (k and v share a dtype, which may differ from q's).
    kv_layout : ``"NHD"`` or ``"HND"``.
    pos_encoding_mode : ``"NONE"``, ``"ROPE_LLAMA"`` (q at position ``kv_len - 1``, key ``j`` at
        ``j``) or ``"ALIBI"`` (bias ``slope_h * j``).
    use_tensor_cores : accepted for compatibility. Upstream it picks the prefill kernel instead of
        the CUDA-core decode kernel (same result); here the dispatcher picks the kernel, so it is
        a hint with no effect on the result.
    q_scale, k_scale : float calibration scales multiplied into ``sm_scale``.
    v_scale : float calibration scale multiplied into the output (skipped when 1.0).
    window_left : ``-1`` or the number of earlier keys the query also sees (``j >= kv_len - 1 -
        window_left``).
    logits_soft_cap : ``cap * tanh(s / cap)`` on the scaled logits when ``> 0``.
    sm_scale : default ``1 / sqrt(head_dim)``.
    rope_scale, rope_theta : RoPE parameters, default 1.0 and 1e4.
    return_lse : also return the base-2 log-sum-exp ``[num_qo_heads]`` float32.
    backend : ``"auto"`` or a backend / alias from :mod:`flashinfer.overrides` (ours; upstream
        has no ``backend`` argument here).

    Returns
    -------
    ``out [num_qo_heads, head_dim]`` in q's dtype, and ``lse`` when ``return_lse``.
    """
    signature = _decode_signature(q, k, v, kv_layout, pos_encoding_mode, q_scale, k_scale,
                                  v_scale, window_left, logits_soft_cap, sm_scale, rope_scale,
                                  rope_theta, return_lse, backend)  # None while compiling
    hit = _CHECKED_DECODES.get(signature)
    if hit is not None:  # the steady state (never an fp8 or tensor-scaled call: module memo)
        return hit.run(q, k, v, return_lse, backend)
    if fp8_single.is_fp8(k, v) and isinstance(q, torch.Tensor) and not fp8_single.is_fp8(q):
        q, k, v, _, k_scale, v_scale = fp8_single.widen(
            q, k, v, check_kv_layout(kv_layout), 2, None, None, None, None, k_scale, v_scale)
        signature = None  # the memo keeps calls as given, and this one was rewritten
    if isinstance(k_scale, torch.Tensor) or isinstance(v_scale, torch.Tensor):
        check_qkv(q, k, v, check_kv_layout(kv_layout), 2, same_head_dim=True)
        return _tensor_scaled(single_decode_with_kv_cache, q, k, v, kv_layout, 2, k_scale,
                              v_scale, return_lse, dict(
                                  kv_layout=kv_layout, pos_encoding_mode=pos_encoding_mode,
                                  q_scale=q_scale, window_left=window_left,
                                  logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                                  rope_scale=rope_scale, rope_theta=rope_theta, backend=backend))
    layout = check_kv_layout(kv_layout)
    _, _, _, _, head_dim, _ = check_qkv(q, k, v, layout, 2, same_head_dim=True)
    mode, window_left, cap, scale, rope_scale, rope_theta = check_common(
        pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
        head_dim, backend)
    scale *= float_arg("q_scale", q_scale, 1.0) * float_arg("k_scale", k_scale, 1.0)
    check_softmax_scale(scale, "sm_scale * q_scale * k_scale")
    out_scale = float_arg("v_scale", v_scale, 1.0)
    checked = (layout, mode, scale, window_left, cap, rope_scale, rope_theta,
               bool(return_lse), out_scale, backend)
    if signature is not None:
        kv = (k.shape[1], k.shape[0]) if layout == "HND" else k.shape[:2]  # kv_len, heads
        prepared = prepare_single(
            "single_decode", q.device, q.dtype, k.dtype, 1, kv[0], q.shape[0], kv[1],
            q.shape[1], v.shape[-1], False, False, layout, mode, scale, window_left, cap,
            rope_scale, rope_theta, bool(return_lse), q.dtype)
        _CHECKED_DECODES.put(signature, _CheckedDecode(layout, out_scale, kv[0], prepared))
    out, lse = _single_decode_op(q, k, v, *checked)
    return (out, lse) if return_lse else out


def _tensor_scaled(fn, q, k, v, kv_layout: str, q_rank: int, k_scale, v_scale, return_lse: bool,
                   kwargs: dict):
    """``fn`` with ``k_scale`` / ``v_scale`` given as tensors (:mod:`.scales`): ``k_scale``
    folded into q's heads, ``v_scale`` applied to the output heads; a float one passes on."""
    heads = k.shape[0] if kv_layout == "HND" else k.shape[1]
    k_heads = head_scales("k_scale", k_scale, heads, q.device)
    v_heads = head_scales("v_scale", v_scale, heads, q.device)
    q3 = q if q_rank == 3 else q[None]
    if k_heads is not None:
        q3 = fold_k_scale(q3, k_heads)
    result = fn(q3 if q_rank == 3 else q3[0], k, v, k_scale=None if k_heads is not None else k_scale,
                v_scale=None if v_heads is not None else v_scale, return_lse=return_lse, **kwargs)
    if v_heads is not None:
        out = result[0] if return_lse else result
        apply_v_scale(out if q_rank == 3 else out[None], v_heads)
    return result


class _CheckedDecode:
    """What a single_decode_with_kv_cache signature that passed every check keeps: the checked
    layout, ``v_scale`` and KV length, the call's :func:`prepare_single`, and the kernel's
    prepared form (``kernel.prepare``, :mod:`.params`) with the Decision it came from. Only
    calls with 16-bit or fp32 K/V and float scales are stored (fp8 K/V and tensor scales are
    rewritten before the checks), so a hit needs none of that handling."""

    __slots__ = ("hnd", "v_scale", "kv_len", "prepared", "plain", "choice", "bound")

    def __init__(self, layout: str, v_scale: float, kv_len: int, prepared: tuple):
        self.hnd, self.v_scale, self.kv_len, self.prepared = layout == "HND", v_scale, kv_len, prepared
        self.plain = prepared[3] is None and v_scale == 1.0  # no RoPE rewrite, no out scale
        self.choice = dispatch.KeyedDecision(prepared[0], prepared[1])
        self.bound: tuple | None = None  # (Decision, run(q3, k, v)) once bound

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_lse: bool,
            backend: str):
        if self.hnd:
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        if self.plain:
            decision = self.choice.get(backend)
            bound = self.bound
            if bound is None or bound[0] is not decision:
                bound = self._bind(decision, q.device)
            out, lse = bound[1](q[None], k, v)
        else:
            out, lse = run_prepared(q[None], k, v, None, self.v_scale, q.dtype, backend,
                                    self.prepared)
        return (out[0], lse[0]) if return_lse else out[0]

    def _bind(self, decision: dispatch.Decision, device: torch.device) -> tuple:
        kernel, params = decision.kernel, self.prepared[2]
        prepare = getattr(kernel, "prepare", None)
        if prepare is None:
            bound = (decision, lambda q, k, v: kernel(q, k, v, params))
        else:
            bound = (decision, prepare(params, 1, self.kv_len, device))
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self.bound = bound  # (what a capture prepares lives in the graph's pool: not kept)
        return bound


#: eager calls whose arguments passed every check above -> :class:`_CheckedDecode`
#: (:mod:`flashinfer.checked_calls`)
_CHECKED_DECODES = CheckedCalls()


def _decode_signature(q, k, v, *args) -> tuple | None:
    """What single_decode_with_kv_cache's checks read (shapes, dtypes, devices: no strides),
    and the scalars with their types (``True == 1 == 1.0`` as dict keys); None when an argument
    is not a tensor (the checks then run and name it). An unhashable scalar makes the memo
    miss (:class:`~flashinfer.checked_calls.CheckedCalls`)."""
    if (not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor)
            or not isinstance(v, torch.Tensor) or torch.compiler.is_compiling()):
        return None
    return tensor_fact(q), tensor_fact(k), tensor_fact(v), args, tuple(map(type, args))
