"""A paged latent cache (``ckv [pages, P, 512]`` / ``kpe [pages, P, 64]``, any page size, fp8 or
16-bit) gathered into one contiguous 16-bit cache of pages of 64 tokens, dequantised: what lets
a kernel that reads only 16-bit pages of 64 (FlashMLA's dense decode) serve the others. One
launch of our Triton kernel (``triton/_latent_gather_kernels.py``); page ids are checked as they
are read (rule ``fault``, recorded; a bad id's token becomes 0)."""

from __future__ import annotations

import numpy as np
import torch

from ...index_checks import Fault, record

#: tokens per output page (what FlashMLA's dense decode reads)
OUT_PAGE = 64


def gathered_layout(kv_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output pages of each request, for host lengths ``kv_lens [B]``: ``(page_indptr [B+1],
    request [n], first_token [n])`` int32 (request ``b``'s tokens fill pages
    ``page_indptr[b] ..``, in order)."""
    pages = -(-kv_lens.astype(np.int64) // OUT_PAGE)
    indptr = np.concatenate([[0], np.cumsum(pages)])
    req = np.repeat(np.arange(kv_lens.shape[0]), pages)
    first = (np.arange(int(indptr[-1])) - indptr[:-1][req]) * OUT_PAGE
    return indptr.astype(np.int32), req.astype(np.int32), first.astype(np.int32)


def fill_gathered_table(kv_lens: torch.Tensor, starts: torch.Tensor, table: torch.Tensor) -> None:
    """The :func:`gathered_layout` of device lengths ``kv_lens [B]`` (int32), made on the device
    (what a CUDA graph replays): ``starts [B+1]`` int32, each request's first output page and
    the total; ``table [B, W]`` int32, row ``b`` its pages ``starts[b] + j`` (at most ``W``;
    the rest of the row left as it is). One launch, no host sync."""
    from ..triton import _latent_gather_kernels as K
    from ..triton.launch import device_of, fast, pow2

    batch, width = table.shape
    if batch == 0:
        return
    with device_of(table):
        fast(K.gathered_table_kernel)[(batch,)](kv_lens, starts, table, batch, width,
                                                OUT_PAGE=OUT_PAGE, BLOCK_B=max(16, pow2(batch)),
                                                BLOCK_W=256)


def gather_latent(out: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor,
                  request: torch.Tensor | None, first_token: torch.Tensor | None,
                  kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_lens: torch.Tensor,
                  ckv_scale: float, kpe_scale: float, fault: Fault,
                  starts: torch.Tensor | None = None) -> None:
    """``out [n, 64, D_CKV + D_KPE]`` (16-bit, contiguous) <- the tokens :func:`gathered_layout`
    assigns, times their scale: the layout given as ``request`` / ``first_token [n]``, or as
    ``starts [B+1]`` (:func:`fill_gathered_table`; pages past ``starts[B]`` are not written, so
    ``n`` may be a capacity). ``ckv [pages, P, D_CKV]`` / ``kpe [pages, P, D_KPE]`` with unit
    last stride; the index arrays int32 on ``out``'s device. No host sync."""
    from ..triton import _latent_gather_kernels as K
    from ..triton.launch import device_of, fast, pow2

    n, d_ckv, d_kpe = out.shape[0], ckv.shape[-1], kpe.shape[-1]
    batch = kv_lens.shape[0]
    if n == 0 or batch == 0:
        return
    unused = kv_lens  # a pointer argument its constexpr switches off
    with device_of(out):
        fast(K.latent_gather_kernel)[(n,)](
            ckv, kpe, out, record(out.device), unused if request is None else request,
            unused if first_token is None else first_token, unused if starts is None else starts,
            kv_indptr, kv_indices, kv_lens, ckv.stride(0), ckv.stride(1), kpe.stride(0),
            kpe.stride(1), float(ckv_scale), float(kpe_scale), min(ckv.shape[0], kpe.shape[0]),
            fault.code, kv_indices.numel(), batch, PAGE=ckv.shape[1], D_CKV=d_ckv, D_KPE=d_kpe,
            BLOCK_T=OUT_PAGE, BLOCK_CKV=max(16, pow2(d_ckv)),
            BLOCK_KPE=max(16, pow2(max(d_kpe, 1))), FROM_STARTS=starts is not None,
            BLOCK_B=max(16, pow2(batch)) if starts is not None else 16, num_warps=8)


__all__ = ["OUT_PAGE", "fill_gathered_table", "gather_latent", "gathered_layout"]
