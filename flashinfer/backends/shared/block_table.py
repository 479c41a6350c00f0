"""A fixed-width block table built on the device from CSR page ids, for kernels that take
``block_table [batch, width]`` (FlashMLA) under a CUDA graph: one launch of our Triton kernel
(``triton/_block_table_kernels.py``) reads the lengths and ids from the device, so a captured
graph rebuilds the table from whatever the last plan wrote into its buffers. The page ids are
checked as they are copied (rule ``fault``, recorded; a bad id becomes page 0)."""

from __future__ import annotations

import torch

from ...index_checks import Fault, record

#: page ids a program copies per step
BLOCK = 256


def fill_block_table(table: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                     num_pages: int, fault: Fault) -> None:
    """``table [B, W]`` int32 (contiguous): row ``b`` ← ``kv_indices[kv_indptr[b] :
    kv_indptr[b + 1]]`` (at most ``W`` of them; the rest of the row is left as it is).
    ``kv_indptr [B + 1]`` and ``kv_indices`` int32 on the table's device; ids outside ``[0,
    num_pages)`` are recorded under ``fault`` and written as 0. No host sync."""
    from ..triton import _block_table_kernels as K
    from ..triton.launch import device_of, fast

    batch, width = table.shape
    if batch == 0:
        return
    with device_of(table):
        fast(K.block_table_kernel)[(batch,)](
            kv_indptr, kv_indices, table, record(table.device), width, num_pages,
            kv_indices.numel(), fault.code, BLOCK=BLOCK)


__all__ = ["BLOCK", "fill_block_table"]
