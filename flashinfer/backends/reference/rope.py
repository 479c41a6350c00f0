"""Reference RoPE kernel: pure PyTorch, frequencies, angles and rotation in float32.

Signature and semantics: :mod:`flashinfer.rope` (module docstring). Frequencies follow
upstream's float32 formula ``rope_theta ** (-2d / rotary_dim)`` (then the standard or Llama 3.1
scaling). A cache position outside ``[0, max_pos)`` is never read: that token is left
unrotated (its output rows equal its input rows; in place, they are not changed), and when
``params.positions_fault`` is set the bad positions are merged into the device's error record
(:func:`flashinfer.index_checks.report_device`, device ops only).
"""

from __future__ import annotations

import torch

from ...index_checks import Check, report_device


def _frequencies(params, device: torch.device) -> torch.Tensor:
    """``f'_d`` for ``d in [0, rotary_dim/2)``, float32."""
    exponent = torch.arange(0, params.rotary_dim, 2, dtype=torch.float32, device=device)
    exponent = exponent / params.rotary_dim
    base = torch.pow(params.rope_theta, -exponent)
    scaled = base / params.rope_scale
    if params.llama31 is None:
        return scaled
    a, b = params.llama31.smooth_coefficients()
    smooth = (base * a + b).clamp(0.0, 1.0)
    return (1.0 - smooth) * scaled + smooth * base


def _cos_sin(pos_ids: torch.Tensor, params, cache: torch.Tensor | None, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``cos, sin`` of every token's angles, ``[nnz, rotary_dim/2]`` float32, and (cache
    variants) which tokens have a position inside the cache (``None``: every token)."""
    half = params.rotary_dim // 2
    if cache is None:
        angles = pos_ids.to(torch.float32)[:, None] * _frequencies(params, device)[None, :]
        return torch.cos(angles), torch.sin(angles), None
    max_pos = cache.shape[0]
    pos = pos_ids.long()
    inside = (pos >= 0) & (pos < max_pos)
    if params.positions_fault is not None:
        report_device(Check(params.positions_fault, ~inside, pos, max_pos))
    rows = cache[torch.where(inside, pos, torch.zeros_like(pos))]
    return rows[:, :half], rows[:, half:2 * half], inside


def _rotate(x: torch.Tensor, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            inside: torch.Tensor | None, rotary_dim: int, interleave: bool) -> None:
    half = rotary_dim // 2
    head = x[..., :rotary_dim].to(torch.float32)
    if interleave:
        x1, x2 = head[..., 0::2], head[..., 1::2]
    else:
        x1, x2 = head[..., :half], head[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    rotated = torch.stack((o1, o2), dim=-1).flatten(-2) if interleave else torch.cat((o1, o2), -1)
    if inside is not None:  # a token whose position is outside the cache keeps its values
        rotated = torch.where(inside[:, None, None], rotated.to(x.dtype), x[..., :rotary_dim])
    if out is not x and rotary_dim < x.shape[-1]:
        out[..., rotary_dim:].copy_(x[..., rotary_dim:])
    out[..., :rotary_dim].copy_(rotated)


def rope(q, k, q_out, k_out, pos_ids, params, cos_sin_cache) -> None:
    cos, sin, inside = _cos_sin(pos_ids, params, cos_sin_cache, q.device)
    _rotate(q, q_out, cos, sin, inside, params.rotary_dim, params.interleave)
    _rotate(k, k_out, cos, sin, inside, params.rotary_dim, params.interleave)
