"""Reference append into a paged KV cache: one advanced-indexing scatter per cache, in torch.

Kernel signature and semantics: :mod:`flashinfer.page` (module docstring). The inputs are
already in the cache dtype (``flashinfer.page`` checks), so this is a plain copy, bit exact.
"""

from __future__ import annotations

import torch

from . import KERNELS


@KERNELS.kernel("append_paged_kv")
def append_paged_kv(append_key: torch.Tensor, append_value: torch.Tensor,
                    batch_indices: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, kv_indices: torch.Tensor, kv_indptr: torch.Tensor,
                    page_size: int, kv_layout: str) -> None:
    pos = positions.long()
    page = kv_indices.long()[kv_indptr.long()[batch_indices.long()] + pos // page_size]
    slot = pos % page_size
    if kv_layout == "NHD":  # [pages, page_size, H, D]
        k_cache[page, slot] = append_key
        v_cache[page, slot] = append_value
    else:  # HND: [pages, H, page_size, D]
        k_cache[page, :, slot] = append_key
        v_cache[page, :, slot] = append_value
