"""Reference MLA (the ``batch_mla`` contract, :mod:`flashinfer.attention.mla_params`): per request, its
pages of the latent cache gathered and dequantised, then the reference attention kernel in
float32 over ``[ckv | kpe]`` with ``ckv`` as V. Any device; the oracle of the other MLA
backends."""

from __future__ import annotations

import torch

from ...attention.mla_params import MLA_PAGE, MLAPlan, MLAScales
from ...attention.params import AttentionParams
from ...index_checks import Check, raise_first, report_device
from .attention import attention


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
    """The reference runner of ``plan`` (reads the page ids on the device at each run). Each
    request is the reference attention kernel's single-request problem with one KV head: keys
    ``[ckv | kpe]``, values ``ckv``, queries ``[q_nope | q_pe]``."""
    qo = plan.qo_indptr_host.tolist()
    kv_pages = plan.kv_indptr_host.tolist()
    kv_lens = plan.kv_len_host.tolist()
    params = AttentionParams(sm_scale=plan.sm_scale, causal=plan.causal, return_lse=True,
                             o_dtype=torch.float32)

    def run(q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales: MLAScales) -> None:
        indices = _checked_ids(plan.kv_indices[:kv_pages[-1]].to(q_nope.device, torch.long),
                               min(ckv_cache.shape[0], kpe_cache.shape[0]))
        for b in range(plan.batch_size):
            r0, r1, kv_len = qo[b], qo[b + 1], kv_lens[b]
            if r1 == r0:
                continue
            if kv_len == 0:  # no key: output 0, lse -inf (the contract)
                out[r0:r1] = 0
                if lse is not None:
                    lse[r0:r1] = float("-inf")
                continue
            pages = indices[kv_pages[b]:kv_pages[b] + -(-kv_len // plan.page_size)]
            ckv = _latent(ckv_cache, pages, kv_len, scales.ckv_scale, scales.ckv_scale_arr)
            kpe = _latent(kpe_cache, pages, kv_len, scales.kpe_scale, None)
            q = torch.cat([q_nope[r0:r1].float(), q_pe[r0:r1].float()], -1)
            o, l2 = attention(q, torch.cat([ckv, kpe], -1)[:, None], ckv[:, None], params)
            out[r0:r1] = o.to(out.dtype)
            if lse is not None:
                lse[r0:r1] = l2
        return out
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


__all__ = ["batch_mla"]
