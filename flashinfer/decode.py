"""Single-request decode attention (upstream module ``flashinfer.decode``).

``single_decode_with_kv_cache`` is one query token per head against a contiguous KV: the
dispatcher sees op ``single_decode`` (facts and features as described in
:mod:`flashinfer.prefill`, with ``qo_len = 1`` and never ``causal``), and the kernel receives
``q`` as ``[1, num_qo_heads, head_dim]``. The call runs as the custom op
``torch.ops.flashinfer.single_decode_with_kv_cache`` under ``torch.compile``.
"""

from __future__ import annotations

from typing import Optional

import torch

from .api_logging import flashinfer_api
from .attention_params import check_softmax_scale
from .custom_op import custom_op
from .prefill import _number, check_common, check_kv_layout, check_qkv, run_single

__all__ = ["single_decode_with_kv_cache"]


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
    return out.squeeze(0), (lse.squeeze(0) if return_lse else lse)


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
    layout = check_kv_layout(kv_layout)
    _, _, _, _, head_dim, _ = check_qkv(q, k, v, layout, 2, same_head_dim=True)
    mode, window_left, cap, scale, rope_scale, rope_theta = check_common(
        pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
        head_dim, backend)
    scale *= _number("q_scale", q_scale, 1.0) * _number("k_scale", k_scale, 1.0)
    check_softmax_scale(scale, "sm_scale * q_scale * k_scale")
    out_scale = _number("v_scale", v_scale, 1.0)
    out, lse = _single_decode_op(q, k, v, layout, mode, scale, window_left, cap, rope_scale,
                                 rope_theta, bool(return_lse), out_scale, backend)
    return (out, lse) if return_lse else out

from .batch_decode import (  # noqa: E402,F401  (upstream module name)
    BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)
