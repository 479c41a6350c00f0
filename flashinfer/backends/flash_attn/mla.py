"""Paged MLA through FA3's ``qv`` path (the ``batch_mla`` contract,
:mod:`flashinfer.attention.mla_params`), variant ``fa3`` of the flash_attn backend.

FA3 takes MLA as attention with a second query part: given ``q = q_pe [rows, H, 64]``, ``k =
kpe [tokens, 1, 64]``, ``v = ckv [tokens, 1, 512]`` and ``qv = q_nope [rows, H, 512]`` it scores
``(q . k + qv . v) * scale`` and returns ``softmax @ v``: the contract, the latent serving as V.
The ``fa3_fwd`` wheel reads no pages, so every run gathers the requests' tokens into contiguous
rows (one ``index_select`` per cache) and makes one varlen launch (``cu_seqlens_q`` the plan's
``qo_indptr``, ``cu_seqlens_k`` from the kv lengths; causal is bottom-right, as the contract's).
What it pays for is the long-query case (chunked prefill over a latent cache); decode reads
each token twice (the gather, then the kernel).

* plan (``host_arrays``): the token offsets ``cu_seqlens_k [B+1]``, each token's slot and, with
  the page ids on the host (checked by plan()), its page; with the ids on the device, its entry
  in ``kv_indices``, the pages looked up at the first run per cache size, a bad id recorded
  (rule ``MLA_PAGE``) and read as page 0;
* run: the caches may be separate tensors (each is gathered on its own); bf16 only (the wheel
  has no fp16 kernels; FA3's fp8 wants q in fp8 too).
"""

from __future__ import annotations

import numpy as np
import torch

from ...attention.mla_params import MLA_PAGE, MLAPlan, MLAScales
from ...index_checks import Check, report_device
from ..shared.upload import upload_array
from . import attention as varlen  # (fa3_varlen looked up per call: tests replace it)

#: the runner's arrays in ``plan.extra`` (:func:`_host_arrays`)
CU_K, PAGE, ENTRY, SLOT = "fa3_mla_cu_k", "fa3_mla_page", "fa3_mla_entry", "fa3_mla_slot"


class FA3MLARunner:
    makes_output = True

    def __init__(self, plan: MLAPlan):
        self.plan = plan
        arrays = plan.extra if CU_K in plan.extra else {  # (planned for another kernel)
            name: upload_array(a, plan.device) for name, a in _host_arrays(plan).items()}
        self.cu_k = arrays[CU_K]
        self.page = arrays.get(PAGE)
        self.entry, self.slot = arrays.get(ENTRY), arrays[SLOT]
        self.checked_pages = None if self.page is None else "host"
        self.splits = varlen.key_splits(plan.batch_size, plan.num_heads, plan.max_qo_len,
                                 plan.max_kv_len, plan.device)

    def _pages(self, num_pages: int) -> torch.Tensor:
        """``[total_kv]`` page of every token; page ids given on the device are checked once
        per cache size (a bad one recorded and read as page 0)."""
        if self.checked_pages in ("host", num_pages):
            return self.page
        plan = self.plan
        if self.entry.numel():
            page = plan.kv_indices.index_select(0, self.entry.long())
        else:
            page = torch.zeros(0, dtype=torch.int32, device=plan.device)
        check = Check(MLA_PAGE, (page < 0) | (page >= num_pages), page, num_pages,
                      entries=self.entry)
        report_device(check)
        self.page = torch.where(check.bad, 0, page)
        self.checked_pages = num_pages
        return self.page

    def __call__(self, q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales: MLAScales):
        plan = self.plan
        if plan.total_qo == 0 or plan.max_kv_len == 0:
            out = torch.zeros(plan.total_qo, plan.num_heads, plan.head_dim_ckv,
                              dtype=plan.o_dtype, device=plan.device) if out is None else out.zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
            return out
        page = self._pages(min(ckv_cache.shape[0], kpe_cache.shape[0]))
        ckv = ckv_cache[page, self.slot].unsqueeze(1)  # [total_kv, 1, D]: any cache strides
        kpe = kpe_cache[page, self.slot].unsqueeze(1)
        direct = {"out": out} if out is not None and out.is_contiguous() else {}
        result, lse_nat = varlen.fa3_varlen(
            q_pe.contiguous(), kpe, ckv, plan.qo_indptr, self.cu_k, plan.max_qo_len,
            plan.max_kv_len, scale=plan.sm_scale, causal=plan.causal, window=(-1, -1),
            softcap=0.0, qv=q_nope.contiguous(), num_splits=self.splits, **direct)
        if out is None:
            out = result
        elif result is not out:
            out.copy_(result)
        if lse is not None:  # [H, rows] natural log -> [rows, H] base 2, -inf where no key
            torch.mul(lse_nat.t(), 1.4426950408889634, out=lse)
            torch.nan_to_num_(lse, nan=float("nan"), posinf=float("-inf"), neginf=float("-inf"))
        return out


def _host_arrays(plan: MLAPlan) -> dict:
    """``cu_seqlens_k``, each token's slot, and its page (page ids on the host, checked by
    plan()) or its entry in ``kv_indices`` (ids on the device)."""
    lens = plan.kv_len_host.astype(np.int64)
    kv = plan.kv_indptr_host.astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    t = np.arange(int(cu_k[-1])) - np.repeat(cu_k[:-1].astype(np.int64), lens)  # token in request
    entry = np.repeat(kv[:-1], lens) + t // plan.page_size
    arrays = {CU_K: cu_k, SLOT: (t % plan.page_size).astype(np.int32)}
    if plan.kv_indices_host is None:
        arrays[ENTRY] = entry.astype(np.int32)
    else:
        arrays[PAGE] = plan.kv_indices_host[entry].astype(np.int32)
    return arrays


def batch_mla(plan: MLAPlan) -> FA3MLARunner:
    return FA3MLARunner(plan)


batch_mla.host_arrays = _host_arrays


__all__ = ["FA3MLARunner", "batch_mla"]
