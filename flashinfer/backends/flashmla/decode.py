"""FlashMLA dense paged decode (the ``batch_mla`` contract, :mod:`flashinfer.attention.mla_params`)
through the ``flash_mla`` module of the ``sgl-flash-mla`` wheel: its legacy SM 9.0 op
``dense_decode_fwd`` (what ``flash_mla_with_kvcache(..., use_legacy=True)`` calls for a dense
bf16 cache).

The kernel takes ``q [B, q_len, H, 576]`` (``[q_nope | q_pe]``), one cache ``[pages, 64, 1,
576]`` (``[ckv | kpe]`` per token), a block table ``[B, max_pages]`` and the lengths ``[B]``, and
returns ``out [B, q_len, H, 512]`` and ``lse [B, H, q_len]`` (natural log). So:

* plan: the block table is made on the host from the CSR page ids and travels in the plan's one
  upload (``host_arrays``; ids given on the device: gathered there through an index made from
  ``kv_indptr``);
  the split scheduler's metadata is made by the first run from the planned device lengths (as
  a direct ``flash_mla_with_kvcache`` call makes it) and reused by the later runs of the plan;
* run: ``q_nope`` / ``q_pe`` that are views of one ``[..., 576]`` buffer are passed as that
  buffer, others are concatenated into a planned one; the caches must be views of one buffer
  (the record has no ``separate_caches``); the output is the kernel's own (``makes_output``),
  copied only into a given ``out``; lse is turned into base 2 ``[total_qo, H]`` when asked for.

Page ids on the device (not read back by plan()) are checked at the first run against the
caches' page count (rule ``MLA_PAGE``: recorded, and read as page 0), once per plan and cache
size.

CUDA-graph plans (``plan.cuda_graph``): a captured run must replay with what a later plan
wrote, so plan() itself refreshes, in buffers of ``plan.graph_store`` (they outlive the plan),
what the kernel reads besides q and the cache:

* the scheduler metadata, made on the device from the fixed lengths by the wheel's
  ``get_mla_decoding_metadata`` and copied into kept buffers (made inside the graph instead,
  its one-warp kernel took 27 us of a 95 us replay at 16 heads, B=64, kv 4096 on the H200:
  ``benchmarks/results/mla_graph_probe_h200_2026-12-04_1710utc.jsonl``);
* the block table, rebuilt on the device from the wrapper's fixed ``kv_indptr`` /
  ``kv_indices`` buffers (one Triton launch,
  :func:`~flashinfer.backends.shared.block_table.fill_block_table`, which checks each id
  against the caches' page count). plan() knows that count from the wrapper's earlier runs; a
  run on caches of another count (or the first run of a wrapper) rebuilds the table itself,
  and a graph captured then rebuilds it at every replay.

The table is ``[B, W]`` with ``W`` the fewer of the ``kv_indices`` buffer's capacity and the
caches' page count (a request of more pages would repeat one).
"""

from __future__ import annotations

import numpy as np
import torch

from ...attention.mla_params import MLA_PAGE, MLAPlan, MLAScales, joint_latent
from ..shared.block_table import fill_block_table
from ..shared.upload import upload_array
from . import legacy_ops
from ...index_checks import Check, report_device

_LOG2E = 1.4426950408889634
#: the block table's name in ``plan.extra``
BLOCK_TABLE = "flashmla_block_table"
#: in a CUDA-graph wrapper's store: the caches' page count of its last run
_TABLE_PAGES = "flashmla_table_pages"


class FlashMLARunner:
    makes_output = True

    def __init__(self, plan: MLAPlan):
        self.plan = plan
        # (one query length for the whole batch: the record has no varying_qo_len)
        self.q_len = plan.total_qo // plan.batch_size if plan.batch_size else 0
        self.fwd = legacy_ops().dense_decode_fwd.default
        self.table = None
        # the split scheduler's metadata: made by the first run, from the planned lengths (the
        # same call a direct use of flash_mla_with_kvcache makes), then reused; a CUDA-graph
        # plan's is made here into kept buffers (_graph_metadata)
        self.meta = self.splits = None
        self.table_pages = None  # the page count a CUDA-graph plan's table was checked against
        if plan.cuda_graph:
            self.most_pages = int(np.diff(plan.kv_indptr_host).max(initial=0))
            self.meta, self.splits = self._graph_metadata()
            pages = plan.graph_store.get(_TABLE_PAGES)
            if pages is not None:  # the caches' page count of the wrapper's last run
                self._graph_table(pages)
        elif plan.kv_indices_host is not None:  # ids checked by plan(): the table made on the host
            table = plan.extra.get(BLOCK_TABLE)
            if table is None:  # (a plan made for another kernel: not in its upload)
                table = upload_array(_host_table(plan), plan.device)
            width = table.numel() // plan.batch_size if plan.batch_size else 1
            self.table = table.view(plan.batch_size, width)
        else:  # gathered on the device, checked at the first run (_block_table)
            dev = plan.device
            kv = plan.kv_indptr_host.astype(np.int64)
            pages = kv[1:] - kv[:-1]
            slot = np.arange(max(1, int(pages.max(initial=0))))[None, :]
            used = slot < pages[:, None]
            self.pad = upload_array(~used, dev)
            self.entries = upload_array(np.where(used, kv[:-1, None] + slot, 0), dev)
            flat = (plan.kv_indices.index_select(0, self.entries.reshape(-1)) if kv[-1]
                    else torch.zeros(self.entries.numel(), dtype=torch.int32, device=dev))
            self.ids = torch.where(self.pad, 0, flat.view(self.entries.shape)).int()
        self.checked_pages = None
        self.q_buf = None

    def _block_table(self, num_pages: int) -> torch.Tensor:
        """The block table; device ids are checked against ``num_pages`` once per cache size."""
        if self.plan.cuda_graph:
            if self.table_pages != num_pages:
                self._graph_table(num_pages)
            return self.table
        if self.plan.kv_indices_host is not None:
            return self.table
        if self.checked_pages != num_pages:
            check = Check(MLA_PAGE, ~self.pad & ((self.ids < 0) | (self.ids >= num_pages)),
                          self.ids, num_pages, entries=self.entries)
            report_device(check)
            self.table = torch.where(check.bad, 0, self.ids)
            self.checked_pages = num_pages
        return self.table

    def _graph_metadata(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A CUDA-graph plan's scheduler metadata ``[parts, 8]`` and splits ``[B + 1]``, made
        from the fixed lengths into the wrapper's kept buffers."""
        plan = self.plan
        meta, splits = legacy_ops().get_mla_decoding_metadata.default(
            plan.kv_len, self.q_len * plan.num_heads, 1, plan.num_heads, False, None)
        kept_meta = _kept(plan, ("flashmla_meta",) + tuple(meta.shape), torch.int32)
        kept_splits = _kept(plan, ("flashmla_splits",) + tuple(splits.shape), torch.int32)
        kept_meta.copy_(meta)
        kept_splits.copy_(splits)
        return kept_meta, kept_splits

    def _graph_table(self, num_pages: int) -> None:
        """A CUDA-graph plan's ``[B, W]`` table (``self.table``), rebuilt on the device from
        the fixed buffers, its ids checked against ``num_pages``."""
        plan = self.plan
        width = max(1, min(plan.kv_indices.numel(), num_pages))
        if self.most_pages > width:
            raise ValueError(
                f"kv_indptr gives a request {self.most_pages} pages, more than the caches hold "
                f"({num_pages}) or the fixed kv_indices buffer ({plan.kv_indices.numel()}): "
                "FlashMLA's CUDA-graph block table has a row of at most that many pages")
        self.table = _kept(plan, (BLOCK_TABLE, plan.batch_size, width), torch.int32)
        fill_block_table(self.table, plan.kv_indptr, plan.kv_indices, num_pages, MLA_PAGE)
        self.table_pages = plan.graph_store[_TABLE_PAGES] = num_pages

    def _q(self, q_nope: torch.Tensor, q_pe: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        shape = (plan.batch_size, self.q_len, plan.num_heads, plan.head_dim_ckv + plan.head_dim_kpe)
        if joint_latent(q_nope, q_pe):
            st, sh = q_nope.stride(0), q_nope.stride(1)
            return q_nope.as_strided(shape, (self.q_len * st, st, sh, 1))
        if plan.cuda_graph:  # (a captured graph writes into it at every replay: kept)
            self.q_buf = _kept(plan, ("flashmla_q",) + shape, q_nope.dtype)
        elif self.q_buf is None:
            self.q_buf = torch.empty(shape, dtype=q_nope.dtype, device=q_nope.device)
        torch.cat([q_nope, q_pe], -1, out=self.q_buf.view(plan.total_qo, plan.num_heads, -1))
        return self.q_buf

    def __call__(self, q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales: MLAScales):
        plan = self.plan  # (the caches are views of one buffer: the record has no separate_caches)
        num_pages = ckv_cache.shape[0]
        o, l_e, meta, splits = self.fwd(self._q(q_nope, q_pe), self._joint_cache(ckv_cache),
                                        plan.head_dim_ckv, plan.kv_len,
                                        self._block_table(num_pages), plan.sm_scale, plan.causal,
                                        self.meta, self.splits)
        if not plan.cuda_graph:  # (a graph's are made by each plan into kept buffers)
            self.meta, self.splits = meta, splits
        return self._finish(o, l_e, out, lse)

    def _joint_cache(self, ckv_cache: torch.Tensor) -> torch.Tensor:
        """``[pages, page_size, 1, 576]``: the one buffer ``ckv_cache`` is the first 512 of."""
        plan = self.plan
        width = plan.head_dim_ckv + plan.head_dim_kpe
        return ckv_cache.as_strided((ckv_cache.shape[0], plan.page_size, 1, width),
                                    (ckv_cache.stride(0), ckv_cache.stride(1), width, 1))

    def _finish(self, o: torch.Tensor, l_e: torch.Tensor, out, lse) -> torch.Tensor:
        """The kernel's ``o [B, q_len, H, 512]`` (into ``out`` when given) and its ``l_e [B, H,
        q_len]`` (natural log, +inf where no key) into ``lse [total_qo, H]`` base 2, -inf."""
        plan = self.plan
        o = o.view(plan.total_qo, plan.num_heads, plan.head_dim_ckv)
        if out is not None:
            out.copy_(o)
            o = out
        if lse is not None:
            torch.mul(l_e.transpose(1, 2).reshape(plan.total_qo, plan.num_heads), _LOG2E, out=lse)
            torch.nan_to_num_(lse, nan=float("nan"), posinf=float("-inf"), neginf=float("-inf"))
        return o


def _host_table(plan: MLAPlan) -> np.ndarray:
    """The ``[B, max_pages]`` block table of host page ids, flattened (0 past a request's
    pages); a view of the ids when every request has the same page count."""
    kv, ids = plan.kv_indptr_host, plan.kv_indices_host
    batch = plan.batch_size
    pages = kv[1:] - kv[:-1]
    if batch and int(kv[-1]) == batch * int(pages[0]) and pages[0] > 0 and (pages == pages[0]).all():
        return ids[:int(kv[-1])]  # CSR rows of equal length are the table's rows
    slot = np.arange(max(1, int(pages.max(initial=0))))[None, :]
    used = slot < pages[:, None]
    entries = np.where(used, kv[:-1, None] + slot, 0)
    return np.where(used, ids[entries] if ids.size else 0, 0).astype(np.int32).reshape(-1)


def _kept(plan: MLAPlan, key: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The buffer ``key`` (its last entries the shape) of a CUDA-graph wrapper's store,
    allocated on first use; never freed while the wrapper lives (a captured graph may read it)."""
    buf = plan.graph_store.get(key)
    if buf is None:
        shape = tuple(n for n in key if isinstance(n, int))
        buf = plan.graph_store[key] = torch.empty(shape, dtype=dtype, device=plan.device)
    return buf


def _host_arrays(plan: MLAPlan) -> dict:
    """The block table, in the plan's upload, when the page ids were given on the host (a
    CUDA-graph plan builds its table at run)."""
    if plan.kv_indices_host is None or plan.cuda_graph:
        return {}
    return {BLOCK_TABLE: _host_table(plan)}


def batch_mla(plan: MLAPlan) -> FlashMLARunner:
    return FlashMLARunner(plan)


batch_mla.host_arrays = _host_arrays


__all__ = ["FlashMLARunner", "batch_mla"]
