"""Paged MLA of any page size through FlashMLA's SM 9.0 sparse attention kernel (the legacy op
``sparse_prefill_fwd`` of the ``sgl-flash-mla`` wheel; the ``batch_mla`` contract,
:mod:`flashinfer.attention.mla_params`).

The sparse kernel takes ``q [rows, H, 576]`` (``[q_nope | q_pe]``, H 64 or 128), a flat latent
cache ``kv [tokens, 1, 576]`` and per query row the ids of the tokens it attends to, ``indices
[rows, 1, topk]`` (``-1``: none), optionally only the first ``topk_length[row]`` of them; it
returns ``out [rows, H, 512]`` and, asked for base 2, ``lse [rows, H]``. A paged cache of
contiguous pages is such a flat cache (token ``t`` of a request is row ``page * page_size +
slot``), so one call is a whole MLA batch: each query row gets its request's tokens in order,
and a causal row only the first ``kv_len - q_len + i + 1`` of them (``topk_length``). No page
size is special and the query lengths may differ.

What it does not do: split the keys of a row over several programs. A program takes 64 heads of
one query row and all its tokens, so it fills the H200 from about 64 rows of 128 heads
(B=64 kv 4096: 0.133 ms, 549 TFLOP/s; B=16: 0.114 ms, where a split-K kernel wins); the rules
send small batches elsewhere.

* plan: per query row its request, token count and emptiness, in the plan's one upload
  (``host_arrays``); the first run builds the ``indices`` table on the device from
  the planned page ids (``[rows, 1, topk]``, ``topk`` the longest request rounded up to 128) and
  checks the ids against the caches' page count (rule ``MLA_PAGE``: recorded, the token
  skipped), once per cache size;
* run: ``q_nope`` / ``q_pe`` that are views of one ``[rows, H, 576]`` buffer are passed as that
  buffer, others are concatenated into a planned one; the caches must be views of one buffer of
  contiguous pages; the output is the kernel's own (``makes_output``), copied only into a given
  ``out``.
"""

from __future__ import annotations

import numpy as np
import torch

from ...attention.mla_params import MLA_PAGE, MLAPlan, MLAScales, joint_latent
from ..shared.upload import upload_array
from . import legacy_ops
from ...index_checks import Check, report_device

#: the kernel takes the token ids of a row in blocks of this many
TOPK_BLOCK = 128
#: the runner's arrays in ``plan.extra`` (:func:`_host_arrays`)
ROW_REQUEST, TOPK_LENGTH, EMPTY_ROWS = "sparse_row_request", "sparse_topk_length", "sparse_empty_rows"


class FlashMLASparseRunner:
    makes_output = True

    def __init__(self, plan: MLAPlan):
        self.plan = plan
        self.fwd = legacy_ops().sparse_prefill_fwd.default
        self.topk = max(TOPK_BLOCK, -(-plan.max_kv_len // TOPK_BLOCK) * TOPK_BLOCK)
        arrays = plan.extra if ROW_REQUEST in plan.extra else {  # (planned for another kernel)
            name: upload_array(a, plan.device) for name, a in _host_arrays(plan).items()}
        self.rows_are_requests = plan.total_qo == plan.batch_size
        self.row_request = arrays[ROW_REQUEST]
        # a row's token count, where rows differ (ragged or causal: the ids past a request's
        # length are -1 anyway); the rows that see no token
        self.topk_length = arrays.get(TOPK_LENGTH)
        empty = arrays.get(EMPTY_ROWS)
        self.empty_rows = None if empty is None else empty.long()  # (index_fill_ takes int64)
        self.indices = None
        self.checked_pages = None
        self.q_buf = None

    def _indices(self, num_pages: int) -> torch.Tensor:
        """``[rows, 1, topk]`` int32 token ids into the flat cache (-1 past a request's tokens or
        for a page id outside ``[0, num_pages)``, which is reported), once per cache size."""
        if self.checked_pages == num_pages:
            return self.indices
        plan = self.plan
        if num_pages * plan.page_size >= 2**31:
            raise ValueError(f"the FlashMLA sparse kernel addresses tokens with int32: "
                             f"{num_pages} pages x {plan.page_size} is too many; use "
                             f"backend='triton'")
        dev, page_size = plan.device, plan.page_size
        j = torch.arange(self.topk, device=dev, dtype=torch.int32)
        in_request = j[None, :] < plan.kv_len[:, None]  # [B, topk]
        entry = plan.kv_indptr[:-1, None] + torch.div(j, page_size, rounding_mode="floor")
        n_ids = plan.kv_indices.numel()
        entry = torch.where(in_request, entry, 0).clamp_(max=max(n_ids - 1, 0))
        page = (plan.kv_indices.index_select(0, entry.reshape(-1).long()).view(entry.shape)
                if n_ids else torch.zeros_like(entry))
        check = Check(MLA_PAGE, in_request & ((page < 0) | (page >= num_pages)), page, num_pages,
                      entries=entry)
        report_device(check)
        ids = torch.where(in_request & ~check.bad, page * page_size + j % page_size, -1).int()
        if not self.rows_are_requests:
            ids = ids.index_select(0, self.row_request)
        self.indices = ids.unsqueeze(1).contiguous()
        self.checked_pages = num_pages
        return self.indices

    def _q(self, q_nope: torch.Tensor, q_pe: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        width = plan.head_dim_ckv + plan.head_dim_kpe
        if joint_latent(q_nope, q_pe) and q_nope.stride(1) == width:
            return q_nope.as_strided((plan.total_qo, plan.num_heads, width),
                                     (q_nope.stride(0), width, 1))
        if self.q_buf is None:
            self.q_buf = torch.empty(plan.total_qo, plan.num_heads, width, dtype=q_nope.dtype,
                                     device=q_nope.device)
        torch.cat([q_nope, q_pe], -1, out=self.q_buf)
        return self.q_buf

    def __call__(self, q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales: MLAScales):
        plan = self.plan  # (the caches are views of one buffer: the record has no separate_caches)
        num_pages, page_size = ckv_cache.shape[0], plan.page_size
        width = plan.head_dim_ckv + plan.head_dim_kpe
        if ckv_cache.stride(0) != page_size * ckv_cache.stride(1):
            raise ValueError(
                f"the FlashMLA sparse kernel reads the pages as one run of tokens: ckv_cache's "
                f"page stride must be page_size x its token stride, got strides "
                f"{tuple(ckv_cache.stride())}; use backend='triton'")
        kv = ckv_cache.as_strided((num_pages * page_size, 1, width), (ckv_cache.stride(1), width, 1))
        o, _, l2 = self.fwd(self._q(q_nope, q_pe), kv, self._indices(num_pages), plan.sm_scale,
                            plan.head_dim_ckv, None, self.topk_length, True, lse is not None)
        if self.empty_rows is not None:  # rows that see no token: output 0, lse -inf
            o.index_fill_(0, self.empty_rows, 0.0)
        if out is not None:
            out.copy_(o)
            o = out
        if lse is not None:
            lse.copy_(l2)
            if self.empty_rows is not None:
                lse.index_fill_(0, self.empty_rows, float("-inf"))
        return o


def _host_arrays(plan: MLAPlan) -> dict:
    """Per query row: its request (always, it marks the plan as made for this kernel), its token
    count where the rows' counts differ, and the rows that see no token, where there are some;
    they travel in the plan's one upload."""
    qo = plan.qo_indptr_host.astype(np.int64)
    kv_len = plan.kv_len_host.astype(np.int64)
    q_lens = qo[1:] - qo[:-1]
    req = np.repeat(np.arange(plan.batch_size), q_lens)
    seen = kv_len[req]
    if plan.causal:  # row i of q_len sees the first kv_len - q_len + i + 1 tokens
        seen = seen - q_lens[req] + (np.arange(plan.total_qo) - qo[req]) + 1
    seen = np.clip(seen, 0, None)
    arrays = {ROW_REQUEST: req.astype(np.int32)}
    if seen.size and not (seen == seen[0]).all():
        arrays[TOPK_LENGTH] = seen.astype(np.int32)
    if (seen == 0).any():
        arrays[EMPTY_ROWS] = np.flatnonzero(seen == 0).astype(np.int32)
    return arrays


def batch_mla(plan: MLAPlan) -> FlashMLASparseRunner:
    return FlashMLASparseRunner(plan)


batch_mla.host_arrays = _host_arrays


__all__ = ["FlashMLASparseRunner", "TOPK_BLOCK", "batch_mla"]
