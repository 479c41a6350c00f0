"""Upstream's block-table calling conventions of MLA decode, ``trtllm_batch_decode_with_kv_cache_mla``
and ``xqa_batch_decode_with_kv_cache_mla``: each call plans a
:class:`~flashinfer.attention.mla_wrapper.BatchMLAPagedAttentionWrapper` and runs it, so they
run wherever the dispatcher has an MLA kernel (upstream's run on SM 10.x / 12.x only).

* ``query [B, q_len, H, kv_lora_rank + qk_rope_head_dim]`` (576 for DeepSeek): the latent part
  first, then the RoPE part; q_len > 1 is causal, bottom-right aligned.
* ``kv_cache [pages, page_size, 576]`` or ``[pages, 1, page_size, 576]``: per token its latent
  (also V) then its RoPE part.
* ``block_tables [B, max_pages]`` int32 page ids; ``seq_lens [B]`` tokens per request (the new
  query tokens included), read on the host (one synchronisation); ``max_seq_len`` is not needed.
* ``bmm1_scale`` multiplies ``q . k`` over the 576 dims (callers pass ``q_scale * k_scale *
  softmax_scale``), ``bmm2_scale`` the output (``v_scale``): floats or one-element tensors.
* an fp8 (e4m3) cache is read with unit scales (the scales are in ``bmm1_scale`` /
  ``bmm2_scale``); an fp8 query is widened exactly to bf16.

Returns ``out [B, q_len, H, kv_lora_rank]`` (bf16, or ``out``'s dtype), and with ``return_lse``
(or an ``lse`` buffer, written either way) ``lse [B * q_len, H]`` float32 base 2, as upstream's
trtllm-gen. Not served (``NotImplementedError`` naming the argument): sparse MLA
(``sparse_mla_top_k``), sinks, skip-softmax, ragged queries (``cum_seq_lens_q``),
``uses_shared_paged_kv_idx=False``, DCP and the other backend-specific knobs.
"""

from __future__ import annotations

import torch

from .functional import _refuse, _scalar, page_table
from .mla_wrapper import BatchMLAPagedAttentionWrapper

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def trtllm_batch_decode_with_kv_cache_mla(
        query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
        block_tables, seq_lens, max_seq_len, sparse_mla_top_k=0, out=None, bmm1_scale=1.0,
        bmm2_scale=1.0, sinks=None, skip_softmax_threshold_scale_factor=None, enable_pdl=None,
        backend="auto", is_var_seq=True, uses_shared_paged_kv_idx=True, lse=None,
        return_lse=False, cute_dsl_impl="auto", kv_scale_format="auto", cum_seq_lens_q=None,
        max_q_len=None, multi_ctas_kv_counter_buffer=None, sparse_mla_top_k_lens=None,
        enable_dcp=False, cp_world=1, cp_rank=0, causal_seqlens_kv_global=None,
        use_fp16_softmax=None):
    """MLA decode of ``B`` requests, ``q_len`` query tokens each (module docstring).
    ``qk_nope_head_dim`` (the pre-absorption head dim), ``enable_pdl``, ``is_var_seq``,
    ``cute_dsl_impl`` and ``kv_scale_format`` are accepted and not needed; ``backend`` other
    than ``"auto"`` names upstream's kernels and is served by the dispatcher's choice."""
    if sparse_mla_top_k:
        raise NotImplementedError("sparse MLA (sparse_mla_top_k > 0) is not supported")
    _refuse(sinks=sinks, skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
            cum_seq_lens_q=cum_seq_lens_q, max_q_len=max_q_len,
            multi_ctas_kv_counter_buffer=multi_ctas_kv_counter_buffer,
            sparse_mla_top_k_lens=sparse_mla_top_k_lens, enable_dcp=enable_dcp,
            causal_seqlens_kv_global=causal_seqlens_kv_global, use_fp16_softmax=use_fp16_softmax)
    if uses_shared_paged_kv_idx is not True:
        raise NotImplementedError("uses_shared_paged_kv_idx=False is not supported here")
    if cp_world != 1 or cp_rank != 0:
        raise NotImplementedError("context parallelism (cp_world / cp_rank) is not supported")
    if not isinstance(query, torch.Tensor) or query.dim() != 4:
        raise ValueError(f"query must be [batch, q_len, num_heads, kv_lora_rank + "
                         f"qk_rope_head_dim], got {tuple(getattr(query, 'shape', ()))}")
    batch, q_len, heads, width = query.shape
    lora, rope = int(kv_lora_rank), int(qk_rope_head_dim)
    if width != lora + rope:
        raise ValueError(f"query's last dim is {width}, kv_lora_rank + qk_rope_head_dim = "
                         f"{lora + rope}")
    cache = _latent_cache(kv_cache, lora + rope)
    page_size = cache.shape[1]
    indptr, indices, _, lens = page_table(block_tables, seq_lens, page_size)
    q = query if query.dtype not in _FP8 else query.to(torch.bfloat16)
    device = query.device
    wrapper = BatchMLAPagedAttentionWrapper(workspace_buffer, backend=backend)
    wrapper.plan(torch.arange(batch + 1, dtype=torch.int32) * q_len, indptr, indices,
                 lens.to(torch.int32), heads, lora, rope, page_size, q_len > 1,
                 _scalar("bmm1_scale", bmm1_scale), q.dtype, cache.dtype)
    fp8 = dict(ckv_scale=1.0, kpe_scale=1.0) if cache.dtype in _FP8 else {}
    rows = batch * q_len
    flat = q.reshape(rows, heads, width)
    want_lse = bool(return_lse) or lse is not None
    rows_lse = lse.view(rows, heads) if isinstance(lse, torch.Tensor) and lse.dim() == 3 else lse
    result = wrapper.run(flat[..., :lora], flat[..., lora:], cache[..., :lora], cache[..., lora:],
                         lse=rows_lse, return_lse=want_lse, **fp8)
    o, lse_out = result if want_lse else (result, None)
    if lse is not None:
        lse_out = lse  # (returned in the caller's shape)
    o = o.view(batch, q_len, heads, lora)
    scale = _scalar("bmm2_scale", bmm2_scale)
    if scale != 1.0:
        o = o.float().mul_(scale).to(o.dtype)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.numel() != o.numel() or out.device != device:
            raise ValueError(f"out must hold [batch, q_len, num_heads, kv_lora_rank] = "
                             f"{list(o.shape)} on {device}, got "
                             f"{tuple(getattr(out, 'shape', ()))}")
        out.copy_(o.view(out.shape))
        o = out
    elif query.dtype in _FP8 or o.dtype != torch.bfloat16:
        o = o.to(torch.bfloat16)  # upstream's default output dtype
    return (o, lse_out) if return_lse else o


def xqa_batch_decode_with_kv_cache_mla(query, kv_cache, workspace_buffer, qk_nope_head_dim,
                                       kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
                                       max_seq_len, out=None, bmm1_scale=1.0, bmm2_scale=1.0,
                                       sinks=None, enable_pdl=None):
    """Upstream's XQA MLA decode convention: :func:`trtllm_batch_decode_with_kv_cache_mla` with
    one query token per request (upstream's XQA takes no more). Upstream's kernel scales ``q .
    k`` by ``bmm1_scale * bmm2_scale``; here, as in its trtllm-gen path and its tests (which keep
    ``bmm2_scale = 1``), by ``bmm1_scale`` alone."""
    if isinstance(query, torch.Tensor) and query.dim() == 4 and query.shape[1] != 1:
        raise ValueError(f"xqa MLA decode takes one query token per request, got q_len "
                         f"{query.shape[1]}")
    return trtllm_batch_decode_with_kv_cache_mla(
        query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
        block_tables, seq_lens, max_seq_len, out=out, bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale, sinks=sinks, enable_pdl=enable_pdl)


def _latent_cache(kv_cache, width: int) -> torch.Tensor:
    """``[pages, page_size, width]`` from the 3-D form or the 4-D ``[pages, 1, page_size,
    width]`` one (a view)."""
    if not isinstance(kv_cache, torch.Tensor):
        raise TypeError(f"kv_cache must be a tensor, got {type(kv_cache).__name__}")
    if kv_cache.dim() == 4 and kv_cache.shape[1] == 1:
        kv_cache = kv_cache[:, 0]
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != width:
        raise ValueError(f"kv_cache must be [pages, page_size, {width}] or [pages, 1, page_size, "
                         f"{width}], got {tuple(kv_cache.shape)}")
    return kv_cache


__all__ = ["trtllm_batch_decode_with_kv_cache_mla", "xqa_batch_decode_with_kv_cache_mla"]
