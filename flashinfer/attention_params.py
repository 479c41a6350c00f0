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

Semantics every kernel must match (the reference backend is the oracle): scores
``s = sm_scale * q·k``; with ``logits_soft_cap > 0``, ``s = cap * tanh(s / cap)``; ALiBi adds
``slope_h * (j - i_abs)``; the causal mask is bottom-right aligned (query ``r`` sits at absolute
position ``kv_len - qo_len + r`` and sees keys ``j <= r_abs``); ``window_left >= 0`` also hides
keys ``j < r_abs - window_left``; ``custom_mask [qo_len, kv_len]`` (bool, True = keep) replaces
the causal mask; ``ROPE_LLAMA`` rotates q (positions ``kv_len - qo_len + r``) and k (positions
``j``) with non-interleaved RoPE (``rope_scale``, ``rope_theta``) before the product. A query
row that sees no key at all gets output 0 and lse ``-inf``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class AttentionParams:
    sm_scale: float
    causal: bool = False
    window_left: int = -1
    logits_soft_cap: float = 0.0
    pos_encoding_mode: str = "NONE"  # "NONE" | "ROPE_LLAMA" | "ALIBI"
    rope_scale: float = 1.0
    rope_theta: float = 1e4
    custom_mask: torch.Tensor | None = None  # bool [qo_len, kv_len], True = keep
    return_lse: bool = False
    o_dtype: torch.dtype = torch.float16
