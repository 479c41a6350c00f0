"""The index rules of the paged-KV utilities (:mod:`flashinfer.page`), as torch computations.

Each function returns the :class:`~flashinfer.index_checks.Check` list of one call (device ops
only, no synchronisation), in the order the rules are applied: an entry that breaks an earlier
rule is not tested against the later ones. :mod:`flashinfer.page` raises the first bad entry on
the host (CPU tensors, ``FLASHINFER_CHECK_INDICES=1``); the reference append kernel on a GPU
merges them into the device's error record and skips the bad tokens; the Triton append kernel
applies the same rules itself (``backends/triton/_page_kernels.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..index_checks import Check, fault

APPEND = "append_paged_kv_cache"
APPEND_BATCH = fault(APPEND, "batch_indices", "a request index in [0, {bound}) (len(kv_indptr) - 1)")
APPEND_INDPTR = fault(APPEND, "kv_indptr",
                      "non-decreasing offsets into kv_indices, within [0, {bound}] (len(kv_indices))")
APPEND_POSITION = fault(APPEND, "positions",
                        "a position inside its request's pages: [0, pages * page_size), the pages "
                        "being kv_indptr[b + 1] - kv_indptr[b] for b = batch_indices[t]",
                        same_bound=False)
APPEND_PAGE = fault(APPEND, "kv_indices", "a page id in [0, {bound}) (the pages of paged_kv_cache)")

POSITIONS = "get_batch_indices_positions"
POS_INDPTR_START = fault(POSITIONS, "append_indptr", "append_indptr[0] == 0")
POS_INDPTR_ORDER = fault(POSITIONS, "append_indptr", "non-decreasing entries (entry i >= entry i - 1)")
POS_INDPTR_END = fault(POSITIONS, "append_indptr", "a last entry equal to nnz = {bound}")
POS_SEQ_LENS = fault(POSITIONS, "seq_lens",
                     "at least the request's appended count append_indptr[b + 1] - append_indptr[b] "
                     "(seq_lens is the length after the append)", same_bound=False)

SEQ_LENS = "get_seq_lens"
LENS_INDPTR_ORDER = fault(SEQ_LENS, "kv_indptr", "non-decreasing entries (entry i >= entry i - 1)")
LENS_LAST = fault(SEQ_LENS, "kv_last_page_len",
                  "[1, page_size = {bound}] for a request with pages, [0, {bound}] for one without")


@dataclass
class AppendTargets:
    """Where each appended token goes: ``valid`` bool ``[nnz]`` (every rule holds), ``page`` and
    ``slot`` int64 ``[nnz]`` (0 where not valid)."""

    valid: torch.Tensor
    page: torch.Tensor
    slot: torch.Tensor


def append_checks(batch_indices: torch.Tensor, positions: torch.Tensor, kv_indices: torch.Tensor,
                  kv_indptr: torch.Tensor, page_size: int, num_pages: int,
                  skip_padding: bool = False) -> tuple[list[Check], AppendTargets]:
    """The rules of ``append_paged_kv_cache`` for token ``t`` of request ``b = batch_indices[t]``
    at position ``p = positions[t]``: ``0 <= b < B``; ``0 <= kv_indptr[b] <= kv_indptr[b + 1] <=
    len(kv_indices)``; ``0 <= p < (kv_indptr[b + 1] - kv_indptr[b]) * page_size`` (a position past
    the request's own pages would write into the next request's KV); ``0 <= kv_indices[j] <
    num_pages`` for ``j = kv_indptr[b] + p // page_size``. ``skip_padding``: a token with ``b <
    0`` is padding (upstream's fused RoPE + append skips it): not a fault, not written."""
    batch, n_ids = kv_indptr.shape[0] - 1, kv_indices.shape[0]
    b, pos = batch_indices.long(), positions.long()
    padding = b < 0 if skip_padding else torch.zeros_like(b, dtype=torch.bool)
    b_bad = ((b < 0) & ~padding) | (b >= batch)
    checks = [Check(APPEND_BATCH, b_bad, b, batch)]
    b_bad = b_bad | padding  # (padding: no further rule applies, nothing is written)
    if batch < 1:
        zero = torch.zeros_like(b)
        return checks, AppendTargets(torch.zeros_like(b_bad), zero, zero)
    bs = torch.where(b_bad, 0, b)
    indptr = kv_indptr.long()
    start, end = indptr[bs], indptr[bs + 1]
    s_bad = ~b_bad & ((start < 0) | (start > n_ids))
    e_bad = ~b_bad & ~s_bad & ((end < start) | (end > n_ids))
    checks.append(Check(APPEND_INDPTR, s_bad | e_bad, torch.where(s_bad, start, end), n_ids,
                        entries=torch.where(s_bad, bs, bs + 1)))
    ok = ~(b_bad | s_bad | e_bad)
    slots = torch.where(ok, end - start, 0) * page_size
    p_bad = ok & ((pos < 0) | (pos >= slots))
    checks.append(Check(APPEND_POSITION, p_bad, pos, slots))
    ok = ok & ~p_bad
    j = torch.where(ok, start + torch.div(pos, page_size, rounding_mode="floor"), 0)
    page = kv_indices.long()[j] if n_ids else torch.zeros_like(j)
    g_bad = ok & ((page < 0) | (page >= num_pages))
    checks.append(Check(APPEND_PAGE, g_bad, page, num_pages, entries=j))
    ok = ok & ~g_bad
    zero = torch.zeros_like(page)
    return checks, AppendTargets(ok, torch.where(ok, page, zero),
                                 torch.where(ok, pos.remainder(page_size), zero))


def positions_checks(append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int
                     ) -> tuple[list[Check], torch.Tensor, torch.Tensor]:
    """The rules of ``get_batch_indices_positions`` and its result: ``(checks, batch_indices,
    positions)``, int64 ``[nnz]``. A token no request covers gets the last request's index."""
    device = append_indptr.device
    indptr, lens = append_indptr.long(), seq_lens.long()
    batch = indptr.shape[0] - 1
    first = indptr[:1]
    checks = [Check(POS_INDPTR_START, first != 0, first, 0)]
    order_bad = indptr[1:] < indptr[:-1]
    checks.append(Check(POS_INDPTR_ORDER, order_bad, indptr[1:], None,
                        entries=torch.arange(1, batch + 1, device=device)))
    last = indptr[-1:]
    checks.append(Check(POS_INDPTR_END, last != nnz, last, nnz,
                        entries=torch.full_like(last, batch)))
    counts = indptr[1:] - indptr[:-1]
    checks.append(Check(POS_SEQ_LENS, lens < counts, lens, counts))
    t = torch.arange(nnz, device=device)
    if batch < 1:
        zero = torch.zeros_like(t)
        return checks, zero, zero
    b = torch.searchsorted(indptr[1:], t, right=True).clamp_max(batch - 1)
    pos = t - indptr[b] + lens[b] - counts[b]
    return checks, b, pos


def seq_lens_checks(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
                    ) -> tuple[list[Check], torch.Tensor]:
    """The rules of ``get_seq_lens`` and its result (int64 ``[B]``), upstream's formula
    ``clamp(pages - 1, min=0) * page_size + last``."""
    device = kv_indptr.device
    indptr, last = kv_indptr.long(), kv_last_page_len.long()
    pages = indptr[1:] - indptr[:-1]
    checks = [Check(LENS_INDPTR_ORDER, pages < 0, indptr[1:], None,
                    entries=torch.arange(1, indptr.shape[0], device=device))]
    low = (pages > 0).long()
    checks.append(Check(LENS_LAST, (last < low) | (last > page_size), last, page_size))
    lens = (pages - 1).clamp_min(0) * page_size + last
    return checks, lens
