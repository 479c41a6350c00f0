"""Reference append into a paged KV cache: one advanced-indexing scatter per cache, in torch.

Kernel signature and semantics: :mod:`flashinfer.page` (module docstring). The inputs are
already in the cache dtype (``flashinfer.page`` checks), so this is a plain copy, bit exact.

On the CPU, :mod:`flashinfer.page` has checked the index arrays before this runs. On a GPU it has
not (that would need a synchronisation), so this kernel applies the rules of
:func:`flashinfer.attention.page_rules.append_checks` with device ops, reports a fault into the error
record, and writes no bad token: each one repeats the first valid token's write (same slot,
same value), so the scatter's result does not depend on the order of duplicate writes.
"""

from __future__ import annotations

import torch

from ...index_checks import report_device
from ...attention.page_rules import append_checks


def append_paged_kv(append_key: torch.Tensor, append_value: torch.Tensor,
                    batch_indices: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, kv_indices: torch.Tensor, kv_indptr: torch.Tensor,
                    page_size: int, kv_layout: str, skip_padding: bool = False) -> None:
    if append_key.shape[0] == 0:
        return
    if k_cache.is_cuda:
        guarded = _guarded_targets(append_key, append_value, batch_indices, positions, k_cache,
                                   v_cache, kv_indices, kv_indptr, page_size, kv_layout,
                                   skip_padding)
        if guarded is None:
            return
        page, slot, keys, values = guarded
    else:
        if skip_padding:  # (the CPU: dropping the padding tokens costs no device sync)
            keep = batch_indices >= 0
            append_key, append_value = append_key[keep], append_value[keep]
            batch_indices, positions = batch_indices[keep], positions[keep]
        pos = positions.long()
        page = kv_indices.long()[kv_indptr.long()[batch_indices.long()] + pos // page_size]
        slot, keys, values = pos % page_size, append_key, append_value
    if kv_layout == "NHD":  # [pages, page_size, H, D]
        k_cache[page, slot] = keys
        v_cache[page, slot] = values
    else:  # HND: [pages, H, page_size, D]
        k_cache[page, :, slot] = keys
        v_cache[page, :, slot] = values


def _guarded_targets(append_key, append_value, batch_indices, positions, k_cache, v_cache,
                     kv_indices, kv_indptr, page_size, kv_layout, skip_padding: bool):
    """(page, slot, key rows, value rows) with every bad (or padding) token redirected (no
    synchronisation); None when the cache has no page (every token is then bad and nothing is
    written)."""
    checks, targets = append_checks(batch_indices, positions, kv_indices, kv_indptr, page_size,
                                    k_cache.shape[0], skip_padding)
    for check in checks:
        report_device(check)
    if k_cache.shape[0] == 0:
        return None
    valid = targets.valid
    # the first valid token (0 when there is none), as a 1-element tensor: indexing by a 0-d
    # tensor would read it back to the host
    first = valid.to(torch.int8).argmax().view(1)
    any_valid = valid.any()
    page = torch.where(valid, targets.page,
                       torch.where(any_valid, targets.page.index_select(0, first), 0))
    slot = torch.where(valid, targets.slot,
                       torch.where(any_valid, targets.slot.index_select(0, first), 0))
    rows = torch.where(valid, torch.arange(valid.shape[0], device=valid.device), first)
    keep = (any_valid | valid)[:, None, None]
    old_k = k_cache[0, 0] if kv_layout == "NHD" else k_cache[0, :, 0]
    old_v = v_cache[0, 0] if kv_layout == "NHD" else v_cache[0, :, 0]
    keys = torch.where(keep, append_key[rows], old_k)
    values = torch.where(keep, append_value[rows], old_v)
    return page, slot, keys, values
