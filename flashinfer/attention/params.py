"""The canonical arguments every single-request attention kernel receives.

The public functions (:mod:`flashinfer.decode`, :mod:`flashinfer.prefill`) validate the user's
arguments, normalise layouts and defaults, and call the chosen kernel as::

    out, lse = kernel(q, k, v, params)

* ``q``: ``[qo_len, num_qo_heads, head_dim_qk]`` (decode passes ``qo_len = 1``)
* ``k``: ``[kv_len, num_kv_heads, head_dim_qk]``, ``v``: ``[kv_len, num_kv_heads, head_dim_vo]``
  — always NHD *views*; an HND input arrives as ``transpose(0, 1)`` of the caller's tensor, so a
  kernel must honour strides (or copy) and never assume contiguity.
* returns ``out [qo_len, num_qo_heads, head_dim_vo]`` in ``params.o_dtype`` and, when
  ``params.return_lse``, ``lse [qo_len, num_qo_heads]`` float32 in **base 2**, else ``None``.

Semantics every kernel must match (the reference backend is the oracle). Query row ``r`` sits at
absolute position ``i = kv_len - qo_len + r``; query head ``h`` reads kv head
``h // (num_qo_heads // num_kv_heads)``.

1. ``ROPE_LLAMA``: q (positions ``i``) and k (positions ``j``) are rotated with non-interleaved
   RoPE (pairs ``(x[t], x[t + d/2])``, angle ``pos / rope_scale * rope_theta ** (-2t / d)``,
   ``d = head_dim_qk``) before the product.
2. ``s = sm_scale * q·k``.
3. ``ALIBI``: ``s += alibi_slopes[h] * (j - r)``. As upstream FlashInfer, the distance uses the
   row index ``r`` inside this call, not ``i``: the softmax (so the output) is the same either
   way, only the lse depends on it, and this is the lse upstream returns.
4. ``logits_soft_cap > 0``: ``s = cap * tanh(s / cap)`` (after the ALiBi bias).
5. Mask: ``custom_mask [qo_len, kv_len]`` (bool, True = keep) when given, and then ``causal`` is
   ignored; else ``causal`` hides keys ``j > i`` (bottom-right aligned). ``window_left >= 0``
   also hides keys ``j < i - window_left`` (with or without causal or a custom mask).
6. Softmax over the visible keys, ``out = softmax(s) @ v`` (then cast to ``o_dtype``);
   ``lse = log2(sum_j exp(s_j))``. A row that sees no key gets output 0 and lse ``-inf``.

A kernel may also offer ``kernel.prepare(params, qo_len, kv_len, device)``: a function
``run(q, k, v) -> (out, lse)`` for calls of exactly those lengths and params, with what a call
of them derives (sequence offsets, launch arguments) made once. The steady-state memo of
``single_decode_with_kv_cache`` keeps it with the Decision it came from.

The op modules simplify before they build the Problem (a kernel must still accept the general
form): ``causal`` is dropped when ``qo_len == 1`` (it hides nothing) and ``window_left >=
kv_len - 1`` becomes ``-1`` (it hides nothing). ``v_scale`` is applied by the op module to the
kernel's output, never by a kernel.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

__all__ = ["AttentionParams", "get_alibi_slopes", "POS_ENCODING_MODES", "MAX_SOFTMAX_SCALE",
           "LARGE_SOFTMAX_SCALE",
           "check_softmax_scale", "check_rope_scalars"]

#: The largest softmax scale (``sm_scale`` times ``q_scale`` and ``k_scale``) any attention entry
#: point accepts; the scale must also be > 0 (FA2, FA3 and cuDNN track the row maximum of the
#: unscaled scores, so a negative scale overflows, and a zero one multiplies masked -inf scores
#: into NaN: both gave NaN rows on the H200). Every kernel here (FA2/FA3, cuDNN, torch SDPA,
#: Triton, the reference) forms
#: ``scale * q.k`` in float32 (fp16 in torch's math path, after ``sqrt(scale)`` on each side);
#: a scaled score that overflows turns its whole row into NaN, although the exact softmax is
#: finite (it tends to a one-hot on the largest score). Past ``|scale| ~ 100 / (score gap)`` the
#: softmax is already that one-hot, so no model needs more than this bound, and at this bound the
#: scaled scores stay finite for ``|q.k| <= 3e34`` (fp32) and for fp16 inputs with ``|q|, |k| <=
#: 2.5`` per element at head dim 128 in torch's math path.
MAX_SOFTMAX_SCALE = 1e4

#: Above this softmax scale a single-request Problem has feature ``large_sm_scale``, which only
#: the records run at such scales declare (FA3 returned NaN rows for one input at 1e4: see
#: capability_db/flash_attn.toml). Real models use scales well below it.
LARGE_SOFTMAX_SCALE = 16.0

#: upstream ``PosEncodingMode`` names, in enum order (NONE=0, ROPE_LLAMA=1, ALIBI=2)
POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")


@dataclass(frozen=True, eq=False)
class AttentionParams:
    sm_scale: float
    causal: bool = False
    window_left: int = -1
    logits_soft_cap: float = 0.0
    pos_encoding_mode: str = "NONE"  # "NONE" | "ROPE_LLAMA" | "ALIBI"
    rope_scale: float = 1.0
    rope_theta: float = 1e4
    custom_mask: torch.Tensor | None = None  # bool [qo_len, kv_len], True = keep, on q's device
    return_lse: bool = False
    o_dtype: torch.dtype = torch.float16
    alibi_slopes: torch.Tensor | None = None  # float32 [num_qo_heads] on q's device when ALIBI


def check_softmax_scale(scale: float, what: str = "sm_scale") -> float:
    """``scale`` if ``0 < scale <= MAX_SOFTMAX_SCALE``, else ``ValueError`` naming ``what``
    (e.g. ``"sm_scale * q_scale * k_scale"``)."""
    if not 0.0 < scale <= MAX_SOFTMAX_SCALE:  # NaN fails too
        raise ValueError(f"{what} = {scale!r} is outside what the kernels compute without "
                         f"overflow: allowed 0 < {what} <= {MAX_SOFTMAX_SCALE:g} (a larger scale "
                         "already makes the softmax a one-hot on the largest score and overflows "
                         "float32 into NaN rows; a zero or negative one gives NaN rows on FA2, "
                         "FA3 and cuDNN)")
    return scale


def check_rope_scalars(rope_scale, rope_theta) -> tuple[float, float]:
    """``(rope_scale, rope_theta)`` with upstream's defaults (1.0, 1e4) for None; each must be a
    finite float > 0 (``ValueError`` / ``TypeError`` naming it otherwise)."""
    out = []
    for name, value, default in (("rope_scale", rope_scale, 1.0), ("rope_theta", rope_theta, 1e4)):
        if value is None:
            out.append(default)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a float or None, got {type(value).__name__}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a finite float > 0")
        out.append(float(value))
    return out[0], out[1]


def get_alibi_slopes(n_heads: int, device: torch.device | str | None = None) -> torch.Tensor:
    """ALiBi slopes, float32 ``[n_heads]`` (the numbers upstream FlashInfer uses).

    With ``p`` the largest power of two ``<= n_heads``, head ``k`` (1-based, ``k <= p``) gets
    ``2 ** (-8 k / p)``; the remaining ``n_heads - p`` heads take the odd-numbered slopes of a
    ``2p``-head model, ``2 ** (-4 (2m - 1) / p)`` for ``m = 1, 2, ...``.
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"get_alibi_slopes: n_heads must be a positive int, got {n_heads!r}")
    slopes = _alibi_slopes_cpu(n_heads).clone()
    return slopes if device is None else slopes.to(device)


@functools.lru_cache(maxsize=64)
def _alibi_slopes_cpu(n_heads: int) -> torch.Tensor:
    p = 1 << (n_heads.bit_length() - 1)
    exponents = [-8.0 * k / p for k in range(1, p + 1)]
    exponents += [-4.0 * (2 * m - 1) / p for m in range(1, n_heads - p + 1)]
    return torch.tensor([math.pow(2.0, e) for e in exponents], dtype=torch.float32)


@functools.lru_cache(maxsize=64)
def cached_alibi_slopes(n_heads: int, device: torch.device) -> torch.Tensor:
    """Slopes kept on ``device`` (one host-to-device copy per head count and device)."""
    return _alibi_slopes_cpu(n_heads).to(device)
