"""Reference single-request attention: float32 math, every feature of
:class:`~flashinfer.attention.params.AttentionParams`; the oracle the fast backends are tested
against.

Kernels ``single_decode`` and ``single_prefill`` share one implementation (decode is
``qo_len = 1``). Query rows are processed in chunks so the score matrix of a long prefill never
needs ``qo_len x kv_len x num_qo_heads`` floats at once: each chunk holds at most
``CHUNK_ELEMENTS`` scores (one ``kv_len`` row per query head is the minimum).
"""

from __future__ import annotations

import math

import torch

from ...attention.params import AttentionParams, get_alibi_slopes

#: score elements materialised per chunk of query rows (64 Mi floats = 256 MiB)
CHUNK_ELEMENTS = 1 << 26

_LOG2E = 1.0 / math.log(2.0)


def rope_llama(x: torch.Tensor, positions: torch.Tensor, rope_scale: float, rope_theta: float
               ) -> torch.Tensor:
    """Non-interleaved RoPE on float32 ``x [n, heads, d]`` at ``positions [n]`` (d even)."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = rope_theta ** (-torch.arange(half, dtype=torch.float64, device=x.device) * 2.0 / d)
    angle = (positions.to(torch.float64)[:, None] / rope_scale) * inv_freq[None, :]
    cos = angle.cos().to(torch.float32)[:, None, :]
    sin = angle.sin().to(torch.float32)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def visible_keys(rows: torch.Tensor, qo_len: int, kv_len: int, params: AttentionParams
                 ) -> torch.Tensor | None:
    """Bool ``[len(rows), kv_len]``: which keys each query row sees (``None`` = all of them)."""
    keys = torch.arange(kv_len, device=rows.device)
    pos = rows + (kv_len - qo_len)  # absolute position of each query row
    mask = None
    if params.custom_mask is not None:
        mask = params.custom_mask[rows].to(torch.bool)
    elif params.causal:
        mask = keys[None, :] <= pos[:, None]
    if params.window_left >= 0:
        in_window = keys[None, :] >= (pos - params.window_left)[:, None]
        mask = in_window if mask is None else mask & in_window
    return mask


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttentionParams
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The canonical single-request kernel (see :mod:`flashinfer.attention.params`)."""
    qo_len, num_qo_heads, _ = q.shape
    kv_len, num_kv_heads, _ = k.shape
    head_dim_vo = v.shape[-1]
    group = num_qo_heads // num_kv_heads
    device = q.device

    qf, kf = q.to(torch.float32), k.to(torch.float32)
    if params.pos_encoding_mode == "ROPE_LLAMA":
        q_pos = torch.arange(kv_len - qo_len, kv_len, device=device)
        qf = rope_llama(qf, q_pos, params.rope_scale, params.rope_theta)
        kf = rope_llama(kf, torch.arange(kv_len, device=device), params.rope_scale, params.rope_theta)
    k_heads = kf.permute(1, 2, 0)  # [H_kv, D_qk, kv_len]
    v_heads = v.to(torch.float32).permute(1, 0, 2)  # [H_kv, kv_len, D_vo]

    slopes = None
    if params.pos_encoding_mode == "ALIBI":
        slopes = params.alibi_slopes if params.alibi_slopes is not None else get_alibi_slopes(num_qo_heads)
        slopes = slopes.to(device=device, dtype=torch.float32).view(num_kv_heads, group, 1, 1)

    out = torch.empty(qo_len, num_qo_heads, head_dim_vo, dtype=params.o_dtype, device=device)
    lse = (torch.empty(qo_len, num_qo_heads, dtype=torch.float32, device=device)
           if params.return_lse else None)
    chunk = max(1, CHUNK_ELEMENTS // max(1, num_qo_heads * kv_len))
    keys = torch.arange(kv_len, device=device, dtype=torch.float32)
    for start in range(0, qo_len, chunk):
        stop = min(qo_len, start + chunk)
        rows = torch.arange(start, stop, device=device)
        n = stop - start
        # [n, H_qo, D] -> [H_kv, group * n, D] so each kv head multiplies its query group at once
        q_chunk = qf[start:stop].reshape(n, num_kv_heads, group, -1).permute(1, 2, 0, 3)
        scores = torch.matmul(q_chunk.reshape(num_kv_heads, group * n, -1), k_heads)
        scores = scores.view(num_kv_heads, group, n, kv_len) * params.sm_scale
        if slopes is not None:
            scores = scores + slopes * (keys[None, :] - rows.to(torch.float32)[:, None])
        if params.logits_soft_cap > 0:
            cap = params.logits_soft_cap
            scores = cap * torch.tanh(scores / cap)
        mask = visible_keys(rows, qo_len, kv_len, params)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        weights = torch.exp(scores - row_max)
        denom = weights.sum(dim=-1, keepdim=True)  # 0 exactly when the row sees no key
        o_chunk = torch.matmul(weights.view(num_kv_heads, group * n, kv_len), v_heads)
        o_chunk = o_chunk.view(num_kv_heads, group, n, head_dim_vo) / denom.clamp_min(1e-38)
        out[start:stop] = o_chunk.permute(2, 0, 1, 3).reshape(n, num_qo_heads, head_dim_vo).to(params.o_dtype)
        if lse is not None:
            lse_chunk = (row_max + torch.log(denom)) * _LOG2E  # log(0) = -inf for empty rows
            lse[start:stop] = lse_chunk.view(num_kv_heads, group, n).permute(2, 0, 1).reshape(n, num_qo_heads)
    return out, lse


def single_decode(q, k, v, params: AttentionParams):
    return attention(q, k, v, params)


def single_prefill(q, k, v, params: AttentionParams):
    return attention(q, k, v, params)
