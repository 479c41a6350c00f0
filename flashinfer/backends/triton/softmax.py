"""Triton softmax, variant ``streaming`` (``_softmax_kernels.py``): one program per row for many
rows, split rows (two launches over ``rows x chunks``) for few. The general kernel (variant
``default``) lives in ``sampling.py``.

Split when one program per row would occupy fewer than half the SMs: chunks of whole blocks,
about ``2 x SMs / rows`` of them per row (a 128k row at batch 1 on 132 SMs: 126 chunks of 1,024).
"""

from __future__ import annotations

import torch

from .launch import device_of, fast, pow2, sm_count

#: elements per loop step and warps of a program, one program per row
ROW_BLOCK, ROW_WARPS = 4096, 8
#: the same for a chunk of a split row
CHUNK_BLOCK, CHUNK_WARPS = 1024, 4
#: most chunks per row; also the write kernel's (compile-time) width for the chunk statistics,
#: one value for every row count, so a new batch size does not compile a new kernel
MAX_CHUNKS = 512


def split_chunks(rows: int, vocab: int, sms: int) -> int:
    """Chunks per row: 1 (one program per row) unless ``rows`` programs would fill fewer than
    half of ``sms``; then about ``2 sms / rows``, each at least one block, at most
    ``MAX_CHUNKS``."""
    if 2 * rows >= sms:
        return 1
    return max(1, min(-(-2 * sms // rows), -(-vocab // CHUNK_BLOCK), MAX_CHUNKS))


def softmax_args(out: torch.Tensor, temperature):
    """``(dst, t_ptr, t_val, T_T)`` of a softmax launch: a contiguous output (``out`` or a
    buffer to copy back), and the temperature as a per-row tensor or a scalar."""
    dst = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    t_t = isinstance(temperature, torch.Tensor)
    return (dst, temperature if t_t else dst,
            1.0 if temperature is None or t_t else float(temperature), t_t)


def softmax_streaming(logits, out, temperature, chunks: int | None = None) -> None:
    """``chunks`` (tests, tuning): force the chunk count per row (1: one program per row)."""
    from . import _softmax_kernels as K

    logits = logits.contiguous()
    n_rows, vocab = logits.shape
    if n_rows == 0:
        return
    dst, t_ptr, t_val, t_t = softmax_args(out, temperature)
    if chunks is None:
        chunks = split_chunks(n_rows, vocab, sm_count(logits.device))
    elif not 1 <= chunks <= MAX_CHUNKS:
        raise ValueError(f"chunks must be in [1, {MAX_CHUNKS}], got {chunks}")
    with device_of(logits):
        if chunks <= 1:
            block = max(16, min(ROW_BLOCK, pow2(vocab)))
            fast(K.softmax_rows_kernel)[(n_rows,)](
                logits, dst, t_ptr, t_val, vocab, logits.stride(0), dst.stride(0), T_T=t_t,
                BLOCK=block, num_warps=ROW_WARPS if block >= 2048 else 4)
        else:
            block = max(16, min(CHUNK_BLOCK, pow2(-(-vocab // chunks))))
            chunk = -(-vocab // (chunks * block)) * block  # whole blocks
            n_chunks = -(-vocab // chunk)
            part = torch.empty(n_rows, n_chunks, 2, dtype=torch.float32, device=logits.device)
            grid = (n_rows, n_chunks)
            fast(K.softmax_chunk_stats_kernel)[grid](
                logits, part, t_ptr, t_val, vocab, logits.stride(0), chunk, n_chunks, T_T=t_t,
                BLOCK=block, num_warps=CHUNK_WARPS)
            fast(K.softmax_chunk_write_kernel)[grid](
                logits, dst, part, t_ptr, t_val, vocab, logits.stride(0), dst.stride(0), chunk,
                n_chunks, T_T=t_t, S=MAX_CHUNKS, BLOCK=block, num_warps=CHUNK_WARPS)
    if dst is not out:
        out.copy_(dst)
