"""Reference MLA (the ``batch_mla`` contract, :mod:`flashinfer.attention.mla_params`): per request, its
pages of the latent cache gathered, dequantised and the attention computed in float32 over
``[ckv | kpe]`` with ``ckv`` as V. Any device; the oracle of the other MLA backends."""

from __future__ import annotations

import math

import torch

from ...attention.mla_params import MLA_PAGE, MLAPlan, MLAScales
from ...index_checks import Check, raise_first, report_device

_LN2 = math.log(2.0)
#: float32 scores held at once per request chunk (query rows are cut to stay under it)
CHUNK_ELEMENTS = 1 << 24


def _latent(cache: torch.Tensor, pages: torch.Tensor, kv_len: int, scale, scale_arr):
    """``[kv_len, D]`` float32 tokens of ``pages``, times the fp8 scale (a float, or the
    per-token, per-128-channel ``scale_arr``)."""
    gathered = cache.index_select(0, pages)
    rows = gathered.reshape(gathered.shape[0] * gathered.shape[1], cache.shape[-1])[:kv_len].float()
    if scale_arr is not None:
        groups = scale_arr.index_select(0, pages).flatten(0, 1)[:kv_len]
        rows = rows * groups.float().repeat_interleave(128, dim=-1)[:, :rows.shape[-1]]
    elif scale is not None and scale != 1.0:
        rows = rows * scale
    return rows


def batch_mla(plan: MLAPlan):
    """The reference runner of ``plan`` (reads the page ids on the device at each run)."""
    qo = plan.qo_indptr_host.tolist()
    kv_pages = plan.kv_indptr_host.tolist()
    kv_lens = plan.kv_len_host.tolist()

    def run(q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales: MLAScales) -> None:
        indices = _checked_ids(plan.kv_indices[:kv_pages[-1]].to(q_nope.device, torch.long),
                               min(ckv_cache.shape[0], kpe_cache.shape[0]))
        for b in range(plan.batch_size):
            r0, r1, kv_len = qo[b], qo[b + 1], kv_lens[b]
            if r1 == r0:
                continue
            n_pages = -(-kv_len // plan.page_size)
            pages = indices[kv_pages[b]:kv_pages[b] + n_pages]
            ckv = _latent(ckv_cache, pages, kv_len, scales.ckv_scale, scales.ckv_scale_arr)
            kpe = _latent(kpe_cache, pages, kv_len, scales.kpe_scale, None)
            chunk = max(1, CHUNK_ELEMENTS // max(1, plan.num_heads * max(kv_len, 1)))
            for c0 in range(r0, r1, chunk):
                c1 = min(r1, c0 + chunk)
                o, l2 = _attend(q_nope[c0:c1].float(), q_pe[c0:c1].float(), ckv, kpe,
                                c0 - r0, r1 - r0, plan)
                out[c0:c1] = o.to(out.dtype)
                if lse is not None:
                    lse[c0:c1] = l2
    return run


def _checked_ids(ids: torch.Tensor, num_pages: int) -> torch.Tensor:
    """``ids`` by the rule :data:`MLA_PAGE`: on the CPU a bad one raises ``ValueError``; on a
    GPU it is recorded in the device's error record (``flashinfer.check_errors()``) and read as
    page 0, so no gather steps outside the caches (no synchronisation)."""
    check = Check(MLA_PAGE, (ids < 0) | (ids >= num_pages), ids, num_pages)
    if ids.device.type == "cpu":
        raise_first([check])
        return ids
    report_device(check)
    return torch.where(check.bad, 0, ids)


def _attend(qn, qp, ckv, kpe, first_row: int, q_len: int, plan: MLAPlan):
    """``(out [n, H, Dckv], lse base 2 [n, H])`` of query rows ``first_row ..`` of a request."""
    kv_len = ckv.shape[0]
    scores = torch.einsum("nhd,td->nht", qn, ckv)
    if kpe.shape[-1]:
        scores = scores + torch.einsum("nhd,td->nht", qp, kpe)
    scores = scores * plan.sm_scale
    if plan.causal:
        rows = torch.arange(first_row, first_row + qn.shape[0], device=qn.device)
        keys = torch.arange(kv_len, device=qn.device)
        visible = keys[None, :] <= (kv_len - q_len + rows)[:, None]  # [n, t]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True) if kv_len else scores.new_zeros(
        scores.shape[:-1] + (1,))
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    seen = denom > 0
    out = torch.einsum("nht,td->nhd", weights / torch.where(seen, denom, 1.0), ckv)
    out = torch.where(seen, out, 0.0)
    lse = torch.where(seen, (row_max + torch.log(torch.where(seen, denom, 1.0))),
                      float("-inf"))[..., 0] / _LN2
    return out, lse


__all__ = ["batch_mla"]
