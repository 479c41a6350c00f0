"""FlashMLA's dense bf16 decode serving an fp8 latent cache (record ``flashmla:dequant``): each
run gathers the planned requests' tokens into a contiguous bf16 cache of pages of 64,
dequantised (``ckv * ckv_scale``, ``kpe * kpe_scale`` in fp32, rounded to bf16: the rounding a
bf16 cache has), with one launch of our Triton kernel
(:func:`~flashinfer.backends.shared.latent_gather.gather_latent`, which checks the page ids),
then runs :class:`.decode.FlashMLARunner` on it. The query stays in bf16, so unlike
``flashmla:fp8`` nothing but the cache's own rounding separates it from the reference.

The gathered cache costs a read of the fp8 tokens and a write of twice their bytes per run
(about 0.13 ms for 64 requests of 4096 tokens on the H200) and lives as long as the plan:
``batch_size x max_kv_len`` is bounded by :data:`MAX_TOKENS` (the check), 1.2 GB of bf16 at
most. Any source page size; separate ckv / kpe caches; one per-tensor scale each (per-token
scales are the Triton kernel's).

CUDA-graph plans (record ``flashmla:dequant_graph``): the layout is made on the device by every
run (:func:`~flashinfer.backends.shared.latent_gather.fill_gathered_table` from the fixed
lengths), the gather covers a cache sized for the fixed ``kv_indices`` buffer's capacity (its
pages x the page size, in pages of 64, plus one a request) and writes only the pages the
lengths need, and the dense decode makes its scheduler metadata in the graph; the cache, the
layout and the table live in the wrapper's graph store (a captured graph reads them).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ...attention.mla_params import MLA_PAGE, MLAPlan, MLAScales
from ...reasons import Reason
from ..shared.latent_gather import OUT_PAGE, fill_gathered_table, gather_latent, gathered_layout
from ..shared.upload import upload_array
from .decode import BLOCK_TABLE, FlashMLARunner, _host_table, _kept

#: the most ``batch_size x max_kv_len`` (bucketed) a plan may gather
MAX_TOKENS = 1 << 20
_REQ, _FIRST = "flashmla_gather_request", "flashmla_gather_first"


def reasons(problem) -> list[Reason]:
    shape = dict(problem.shape)
    tokens = shape.get("batch_size", 0) * shape.get("max_kv_len", 0)
    if tokens > MAX_TOKENS:
        return [Reason("shape.batch_size*max_kv_len", tokens, f"<= {MAX_TOKENS}",
                       f"flashmla:dequant gathers the batch into a bf16 cache: {tokens} tokens "
                       f"(bucketed) is over its {MAX_TOKENS}-token bound")]
    return []


def _dense_plan(plan: MLAPlan, page_indptr, table) -> MLAPlan:
    """The plan FlashMLA's dense decode runs over the gathered cache: its pages in order."""
    n = int(page_indptr[-1])
    ids = np.arange(n, dtype=np.int32)
    return replace(plan, page_size=OUT_PAGE, kv_dtype=torch.bfloat16,
                   kv_indptr_host=page_indptr, kv_indices_host=ids,
                   kv_indices=torch.from_numpy(ids), max_page_id=n - 1, cuda_graph=False,
                   extra={} if table is None else {BLOCK_TABLE: table})


class _GatheredTableRunner(FlashMLARunner):
    """The dense decode of a CUDA-graph plan over the gathered cache: its block table is the
    one :func:`fill_gathered_table` makes (the graph-store buffer ``table``)."""

    def __init__(self, plan: MLAPlan, table: torch.Tensor):
        super().__init__(plan)
        self.gathered = table

    def _block_table(self, num_pages: int) -> torch.Tensor:
        return self.gathered


class FlashMLADequantRunner:
    makes_output = True

    def __init__(self, plan: MLAPlan):
        self.plan = plan
        if plan.cuda_graph:
            self._init_graph(plan)
            return
        self.starts = None
        page_indptr, req, first = gathered_layout(plan.kv_len_host)
        dev = plan.device
        self.request = plan.extra.get(_REQ)
        if self.request is None:  # (a plan made for another kernel: not in its upload)
            self.request, first_d = upload_array(req, dev), upload_array(first, dev)
        else:
            first_d = plan.extra[_FIRST]
        self.first = first_d
        self.pages = int(page_indptr[-1])
        self.dense = FlashMLARunner(_dense_plan(plan, page_indptr, plan.extra.get(BLOCK_TABLE)))
        width = plan.head_dim_ckv + plan.head_dim_kpe
        self.cache = torch.empty(max(1, self.pages), OUT_PAGE, width, dtype=torch.bfloat16,
                                 device=dev)

    def _init_graph(self, plan: MLAPlan) -> None:
        """Capacity-sized graph-store buffers (see the module note)."""
        tokens = plan.kv_indices.numel() * plan.page_size
        if tokens > MAX_TOKENS:
            raise ValueError(f"flashmla:dequant_graph gathers into a cache sized for the fixed "
                             f"kv_indices buffer: {plan.kv_indices.numel()} pages of "
                             f"{plan.page_size} = {tokens} tokens, over its {MAX_TOKENS}-token "
                             "bound; use a smaller buffer or backend='triton'")
        width = max(1, -(-tokens // OUT_PAGE))
        self.pages = width + plan.batch_size  # (each request may round up one page)
        d = plan.head_dim_ckv + plan.head_dim_kpe
        self.cache = _kept(plan, ("flashmla_gathered", self.pages, OUT_PAGE, d), torch.bfloat16)
        self.starts = _kept(plan, ("flashmla_gather_starts", plan.batch_size + 1), torch.int32)
        table = _kept(plan, ("flashmla_gather_table", plan.batch_size, width), torch.int32)
        dense = replace(plan, page_size=OUT_PAGE, kv_dtype=torch.bfloat16,
                        kv_indices_host=None, extra={})
        self.request = self.first = None
        self.dense = _GatheredTableRunner(dense, table)
        self.table = table

    def __call__(self, q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales: MLAScales):
        plan = self.plan
        if scales.ckv_scale is None and plan.kv_dtype.itemsize == 1:
            raise ValueError("backend flashmla:dequant takes one ckv_scale for the cache; "
                             "ckv_scale_arr (per-token scales) is served by backend='triton'")
        ckv_scale = 1.0 if scales.ckv_scale is None else scales.ckv_scale
        if self.starts is not None:  # a CUDA-graph plan: the layout from the fixed lengths
            fill_gathered_table(plan.kv_len, self.starts, self.table)
        gather_latent(self.cache[:self.pages], ckv_cache, kpe_cache, self.request, self.first,
                      plan.kv_indptr, plan.kv_indices, plan.kv_len, ckv_scale, scales.kpe_scale,
                      MLA_PAGE, starts=self.starts)
        d = plan.head_dim_ckv
        return self.dense(q_nope, q_pe, self.cache[..., :d], self.cache[..., d:], out, lse,
                          MLAScales())


def _host_arrays(plan: MLAPlan) -> dict:
    """The gather's page layout and the dense decode's block table, in the plan's upload (a
    CUDA-graph plan makes them on the device)."""
    if plan.cuda_graph:
        return {}
    page_indptr, req, first = gathered_layout(plan.kv_len_host)
    dense = _dense_plan(plan, page_indptr, None)
    return {_REQ: req, _FIRST: first, BLOCK_TABLE: _host_table(dense)}


def batch_mla(plan: MLAPlan) -> FlashMLADequantRunner:
    return FlashMLADequantRunner(plan)


batch_mla.host_arrays = _host_arrays


__all__ = ["FlashMLADequantRunner", "MAX_TOKENS", "batch_mla", "reasons"]
