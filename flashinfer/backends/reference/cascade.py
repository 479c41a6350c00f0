"""Reference state merging: plain PyTorch in fp32. Kernel signatures and semantics:
:mod:`flashinfer.attention.merge`."""

from __future__ import annotations

import torch


def merged(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``v [rows, n, H, D]``, ``s [rows, n, H]`` -> the merged ``(v [rows, H, D] fp32, s [rows,
    H])``; a (row, head) whose states all have ``s = -inf`` gets ``v = 0``, ``s = -inf``."""
    s = s.float()
    top = s.amax(1) if s.shape[1] else s.new_full((s.shape[0], s.shape[2]), float("-inf"))
    empty = top == float("-inf")
    top = torch.where(empty, 0.0, top)
    w = torch.exp2(s - top[:, None])
    total = w.sum(1)
    out = (w[..., None] * v.float()).sum(1) / torch.where(empty, 1.0, total)[..., None]
    out = torch.where(empty[..., None], 0.0, out)
    return out, torch.where(empty, float("-inf"), top + torch.log2(torch.where(empty, 1.0, total)))


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor,
                v_out: torch.Tensor, s_out: torch.Tensor, mask: torch.Tensor | None) -> None:
    v, s = merged(torch.stack([v_a, v_b], 1), torch.stack([s_a, s_b], 1))
    if mask is not None:  # rows whose mask is False keep what v_out / s_out hold
        v = torch.where(mask[:, None, None], v, v_out.float())
        s = torch.where(mask[:, None], s, s_out)
    v_out.copy_(v)
    s_out.copy_(s)


def merge_states(v: torch.Tensor, s: torch.Tensor, indptr: torch.Tensor | None,
                 v_out: torch.Tensor, s_out: torch.Tensor) -> None:
    if indptr is None:
        out, lse = merged(v, s)
    else:  # each row's states one at a time (a reference, not a fast path)
        bounds = indptr.tolist()
        parts = [merged(v[a:b][None], s[a:b][None]) for a, b in zip(bounds[:-1], bounds[1:])]
        out = torch.cat([p[0] for p in parts]) if parts else v_out.float()
        lse = torch.cat([p[1] for p in parts]) if parts else s_out
    v_out.copy_(out)
    s_out.copy_(lse)


__all__ = ["merge_state", "merge_states", "merged"]
