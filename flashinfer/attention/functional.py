"""Upstream's functional (stateless) paged attention entry points, as calling conventions.

``trtllm_batch_decode_with_kv_cache`` / ``xqa_batch_decode_with_kv_cache``
(``flashinfer.decode``), ``trtllm_batch_context_with_kv_cache`` (``flashinfer.prefill``),
``cudnn_batch_decode_with_kv_cache`` and ``cudnn_batch_prefill_with_kv_cache`` (``flashinfer``
/ ``flashinfer.cudnn``) name
upstream's TensorRT-LLM and XQA kernels; here they are ways of calling paged attention: each
call turns its block table and sequence lengths into a page table, plans a batch wrapper and
runs it, so the dispatcher picks the kernel (``backend="trtllm-gen"`` / ``"xqa"`` are
upstream's kernel names: they fall through to the best kernel here with a note, or raise under
``FLASHINFER_STRICT=1``, :mod:`flashinfer.dispatch`).

Arguments, as upstream:

* ``query``: ``[batch * q_len_per_req, H_qo, D]`` (decode) or ``[cum_seq_lens_q[-1], H_qo, D]``
  (context); ``kv_cache``: ``[pages, 2, H_kv, page_size, D]`` (``kv_layout="HND"``) or
  ``[pages, 2, page_size, H_kv, D]`` (``"NHD"``), or a ``(k_cache, v_cache)`` tuple of 4-D
  page views; fp8 KV allowed where the batch wrappers take it.
* ``block_tables``: int32 ``[batch, max_pages]``, page ids of each request in order;
  ``seq_lens``: int32 ``[batch]`` keys per request (a request reads its first
  ``ceil(seq_len / page_size)`` pages; ids past them are never read, so padding may hold
  anything).
* ``bmm1_scale``: the factor on ``q @ k^T`` (upstream callers pass ``q_scale * k_scale *
  sm_scale``); ``bmm2_scale``: the factor on the output (``v_scale``). Floats, or one-element
  tensors (read on the host: such a call synchronises).

Each call reads ``seq_lens`` on the host (one synchronisation), plans and runs: correct, but it
pays a plan per call; a serving loop that calls it every step is better served by a planned
wrapper. Not served (``NotImplementedError`` naming the argument): NVFP4 output
(``o_sf_scale``, ``o_sf_vec_size``, ``out_dtype="nvfp4"``), ``kv_cache_sf``, ``mask``, ragged
decode queries (``cum_seq_lens_q`` / ``max_q_len`` in decode), skip-softmax, block-sparse
tables, ``uses_shared_paged_kv_idx=False`` and ``o_scale != 1``. With ``return_lse`` (or an
``lse`` buffer, written either way, as upstream's trtllm-gen path does) the lse is the wrappers'
own: float32 ``[num_tokens, num_qo_heads]``, base 2 (upstream's tests compare its trtllm-gen lse
with the paged wrapper's).
"""

from __future__ import annotations

import torch

from .batch_decode import BatchDecodeWithPagedKVCacheWrapper
from .batch_prefill import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper


def _refuse(**given) -> None:
    """NotImplementedError for the first argument given a value other than its default (None
    or False; ``o_scale``: 1.0)."""
    for name, value in given.items():
        default = 1.0 if name == "o_scale" else None
        unset = value is None or value is False or (default is not None and value == default)
        if not unset:
            raise NotImplementedError(f"{name}={value!r} is not supported by this calling "
                                      "convention here (see flashinfer.attention.functional)")


def _shared_page_ids(uses_shared_paged_kv_idx) -> None:
    if uses_shared_paged_kv_idx is not True:
        raise NotImplementedError("uses_shared_paged_kv_idx=False (separate K and V page tables, "
                                  "[batch, 2, max_pages]) is not supported here")


def _scalar(name: str, value) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a float or a one-element tensor, got shape "
                             f"{tuple(value.shape)}")
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or a one-element tensor, got {type(value).__name__}")
    return float(value)


def _kv_facts(kv_cache, kv_layout: str) -> tuple[int, int, int, torch.dtype]:
    """``(page_size, num_kv_heads, head_dim, dtype)`` of an accepted cache form."""
    k = kv_cache[0] if isinstance(kv_cache, (tuple, list)) else kv_cache
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"kv_cache must be a tensor or a (k_cache, v_cache) tuple, got "
                        f"{type(kv_cache).__name__}")
    page_dims = k.shape[-3:-1] if isinstance(kv_cache, (tuple, list)) else k.shape[2:4]
    if k.dim() != (4 if isinstance(kv_cache, (tuple, list)) else 5):
        raise ValueError(f"kv_cache must be [pages, 2, H_kv, page_size, D] (HND) or "
                         f"[pages, 2, page_size, H_kv, D] (NHD), or a tuple of 4-D page views; "
                         f"got shape {tuple(k.shape)}")
    heads, page = (page_dims[0], page_dims[1]) if kv_layout == "HND" else (page_dims[1], page_dims[0])
    return page, heads, k.shape[-1], k.dtype


def page_table(block_tables: torch.Tensor, seq_lens: torch.Tensor, page_size: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(indptr, indices, last_page_len, kv_lens)`` of a plan from a block table: ``indptr`` /
    ``last_page_len`` / ``kv_lens`` on the host, ``indices`` gathered on the block table's device
    (no further synchronisation than reading ``seq_lens``)."""
    if not isinstance(block_tables, torch.Tensor) or block_tables.dim() != 2:
        raise ValueError(f"block_tables must be a 2-D [batch, max_pages] tensor, got "
                         f"{tuple(getattr(block_tables, 'shape', ())) or type(block_tables).__name__}")
    if block_tables.dtype != torch.int32:
        raise TypeError(f"block_tables must be int32, got {block_tables.dtype}")
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() != 1 or seq_lens.dtype.is_floating_point:
        raise ValueError("seq_lens must be a 1-D integer tensor [batch]")
    batch, max_pages = block_tables.shape
    lens = seq_lens.to("cpu", torch.int64)
    if lens.shape[0] != batch:
        raise ValueError(f"seq_lens has {lens.shape[0]} entries, block_tables {batch} rows")
    if bool((lens < 0).any()):
        raise ValueError(f"seq_lens must be >= 0, got {lens.tolist()[:16]}")
    pages = (lens + page_size - 1) // page_size
    if bool((pages > max_pages).any()):
        b = int(torch.nonzero(pages > max_pages)[0, 0])
        raise ValueError(f"seq_lens[{b}]={int(lens[b])} needs {int(pages[b])} pages of "
                         f"{page_size}, block_tables has {max_pages} per request")
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = pages.cumsum(0)
    last = torch.where(lens > 0, lens - (pages - 1) * page_size, 0).to(torch.int32)
    rows = torch.repeat_interleave(torch.arange(batch), pages)
    cols = torch.arange(int(indptr[-1])) - torch.repeat_interleave(indptr[:-1].long(), pages)
    flat = (rows * max_pages + cols).to(block_tables.device)
    indices = block_tables.reshape(-1).index_select(0, flat)
    return indptr, indices, last, lens.to(torch.int32)


def trtllm_batch_decode_with_kv_cache(
        query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale=1.0,
        bmm2_scale=1.0, window_left=-1, out=None, out_dtype=None, o_sf_scale=None,
        o_sf_vec_size=None, sinks=None, kv_layout="HND", enable_pdl=None, backend="auto",
        q_len_per_req=1, o_scale=1.0, mask=None, max_q_len=None, cum_seq_lens_q=None,
        skip_softmax_threshold_scale_factor=None, kv_cache_sf=None,
        uses_shared_paged_kv_idx=True, lse=None, return_lse=False, bmm1_scale_log2=None,
        multi_ctas_kv_counter_buffer=None, enable_block_sparse_attention=False,
        bf16q_fp8kv_transform_mode=None):
    """Paged decode of ``batch = len(seq_lens)`` requests, ``q_len_per_req`` query rows each
    (module docstring): returns ``out [batch * q_len_per_req, H_qo, D]`` in ``out``'s dtype,
    else ``out_dtype``, else the query's. ``max_seq_len`` and ``enable_pdl`` are accepted and
    not needed; ``bmm1_scale_log2`` (the scale times log2(e)) may replace ``bmm1_scale``."""
    _refuse(o_sf_scale=o_sf_scale, o_sf_vec_size=o_sf_vec_size, mask=mask, max_q_len=max_q_len,
            cum_seq_lens_q=cum_seq_lens_q, kv_cache_sf=kv_cache_sf,
            skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
            multi_ctas_kv_counter_buffer=multi_ctas_kv_counter_buffer,
            enable_block_sparse_attention=enable_block_sparse_attention,
            bf16q_fp8kv_transform_mode=bf16q_fp8kv_transform_mode, o_scale=o_scale)
    _shared_page_ids(uses_shared_paged_kv_idx)
    if isinstance(out_dtype, str):
        _refuse(out_dtype=out_dtype)
    scale = (_scalar("bmm1_scale_log2", bmm1_scale_log2) / 1.4426950408889634
             if bmm1_scale_log2 is not None else _scalar("bmm1_scale", bmm1_scale))
    page, heads, head_dim, kv_dtype = _kv_facts(kv_cache, kv_layout)
    indptr, indices, last, _ = page_table(block_tables, seq_lens, page)
    o_dtype = out.dtype if isinstance(out, torch.Tensor) else out_dtype
    wrapper = BatchDecodeWithPagedKVCacheWrapper(workspace_buffer, kv_layout, backend=backend)
    wrapper.plan(indptr, indices, last, query.shape[1], heads, head_dim, page,
                 window_left=window_left, q_data_type=query.dtype, kv_data_type=kv_dtype,
                 o_data_type=o_dtype, sm_scale=scale, q_len_per_req=q_len_per_req)
    return _run(wrapper, query, kv_cache, bmm2_scale, out, sinks, lse, return_lse)


def _run(wrapper, query, kv_cache, bmm2_scale, out, sinks, lse, return_lse):
    """A planned wrapper's run() in the trtllm conventions: ``out``, or ``(out, lse)`` with
    ``return_lse``; a given ``lse`` buffer is written either way."""
    result = wrapper.run(query, kv_cache, v_scale=_scalar("bmm2_scale", bmm2_scale), out=out,
                         sinks=sinks, lse=lse, return_lse=bool(return_lse) or lse is not None)
    if isinstance(result, tuple) and not return_lse:
        return result[0]
    return result


def xqa_batch_decode_with_kv_cache(
        query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale=1.0,
        bmm2_scale=1.0, window_left=-1, out=None, sinks=None, kv_layout="NHD", enable_pdl=None,
        q_len_per_req=1, o_scale=1.0, mask=None, kv_cache_sf=None, q_cu_seq_lens=None):
    """Upstream's XQA decode convention: :func:`trtllm_batch_decode_with_kv_cache` with
    ``backend="xqa"`` and ``kv_layout`` defaulting to ``"NHD"``."""
    _refuse(q_cu_seq_lens=q_cu_seq_lens)
    return trtllm_batch_decode_with_kv_cache(
        query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len,
        bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, window_left=window_left, out=out,
        sinks=sinks, kv_layout=kv_layout, enable_pdl=enable_pdl, backend="xqa",
        q_len_per_req=q_len_per_req, o_scale=o_scale, mask=mask, kv_cache_sf=kv_cache_sf)


def trtllm_batch_context_with_kv_cache(
        query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len,
        bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left=-1,
        out=None, out_dtype=None, o_sf_scale=None, o_sf_vec_size=None, kv_layout="HND",
        enable_pdl=None, sinks=None, kv_cache_sf=None, skip_softmax_threshold_scale_factor=None,
        uses_shared_paged_kv_idx=True, causal=True, lse=None, return_lse=False,
        multi_ctas_kv_counter_buffer=None, use_fp16_softmax=None, uses_spcompress=None):
    """Paged prefill (context) of ``batch_size`` requests: query rows ``cum_seq_lens_q [B+1]``
    (int32, read on the host), keys ``seq_lens`` through ``block_tables`` (module docstring;
    ``cum_seq_lens_kv``, ``max_q_len`` and ``max_kv_len`` are implied by them and not read).
    Causal by default (bottom-right aligned). Returns ``out [cum_seq_lens_q[-1], H_qo, D]``."""
    _refuse(o_sf_scale=o_sf_scale, o_sf_vec_size=o_sf_vec_size, kv_cache_sf=kv_cache_sf,
            skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
            multi_ctas_kv_counter_buffer=multi_ctas_kv_counter_buffer,
            use_fp16_softmax=use_fp16_softmax, uses_spcompress=uses_spcompress)
    _shared_page_ids(uses_shared_paged_kv_idx)
    if isinstance(out_dtype, str):
        _refuse(out_dtype=out_dtype)
    page, heads, head_dim, kv_dtype = _kv_facts(kv_cache, kv_layout)
    indptr, indices, last, _ = page_table(block_tables, seq_lens, page)
    if int(batch_size) != indptr.shape[0] - 1:
        raise ValueError(f"batch_size={batch_size} but seq_lens has {indptr.shape[0] - 1} entries")
    o_dtype = out.dtype if isinstance(out, torch.Tensor) else out_dtype
    wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace_buffer, kv_layout)
    wrapper.plan(cum_seq_lens_q.to("cpu"), indptr, indices, last, query.shape[1], heads, head_dim,
                 page, causal=bool(causal), window_left=window_left,
                 sm_scale=_scalar("bmm1_scale", bmm1_scale), q_data_type=query.dtype,
                 kv_data_type=kv_dtype, o_data_type=o_dtype)
    return _run(wrapper, query, kv_cache, bmm2_scale, out, sinks, lse, return_lse)


def cudnn_batch_decode_with_kv_cache(
        q, k_cache, v_cache, scale, workspace_buffer, *, max_sequence_kv,
        actual_seq_lens_kv=None, block_tables=None, is_cuda_graph_compatible=False,
        batch_offsets_q=None, batch_offsets_o=None, batch_offsets_k=None, batch_offsets_v=None,
        out=None, return_lse=False, lse=None):
    """Upstream's cuDNN decode convention: ``q [batch, H_qo, D]``, paged ``k_cache`` /
    ``v_cache [pages, H_kv, page_size, D]`` read through ``block_tables [batch, pages_per_seq]``
    (int32), ``actual_seq_lens_kv`` keys per request (``[batch]`` or ``[batch, 1, 1, 1]``; None:
    ``max_sequence_kv`` each), softmax ``scale``. Returns ``out [batch, H_qo, D]`` in q's dtype,
    and with ``return_lse`` also ``lse [batch, H_qo]`` float32 as upstream documents it here:
    the *natural-log* log-sum-exp of the scaled scores (the wrappers' lse is base 2). As upstream
    0.6.18, the ``batch_offsets_*`` are accepted and not used (q, o dense), and
    ``is_cuda_graph_compatible`` changes nothing (this path reads the lengths on the host, so it
    cannot be captured). A dense (unpaged) cache, ``block_tables=None``, is not served."""
    if block_tables is None:
        raise NotImplementedError("cudnn_batch_decode_with_kv_cache without block_tables (a dense "
                                  "per-request cache) is not supported here; pass the page table")
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be [batch, num_heads_qo, head_dim], got "
                         f"{tuple(getattr(q, 'shape', ())) or type(q).__name__}")
    batch = q.shape[0]
    if actual_seq_lens_kv is None:
        seq_lens = torch.full((batch,), int(max_sequence_kv), dtype=torch.int32)
    else:
        seq_lens = actual_seq_lens_kv.reshape(-1)
    if seq_lens.shape[0] != batch:
        raise ValueError(f"actual_seq_lens_kv holds {seq_lens.shape[0]} lengths for a batch of {batch}")
    page, heads, head_dim, kv_dtype = _kv_facts((k_cache, v_cache), "HND")
    indptr, indices, last, _ = page_table(block_tables, seq_lens, page)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(workspace_buffer, "HND")
    wrapper.plan(indptr, indices, last, q.shape[1], heads, head_dim, page,
                 q_data_type=q.dtype, kv_data_type=kv_dtype, sm_scale=_scalar("scale", scale))
    if not return_lse:
        return wrapper.run(q, (k_cache, v_cache), out=out)
    o, lse2 = wrapper.run(q, (k_cache, v_cache), out=out, return_lse=True)
    if lse is None:
        return o, lse2.mul_(_LN2)
    torch.mul(lse2, _LN2, out=lse)
    return o, lse


_LN2 = 0.6931471805599453


def _lengths(name: str, t, batch: int | None = None) -> torch.Tensor:
    """Host int64 ``[batch]`` lengths from ``[batch]`` or ``[batch, 1, 1, 1]``."""
    if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point:
        raise ValueError(f"{name} must be an integer tensor [batch] or [batch, 1, 1, 1]")
    lens = t.reshape(-1).to("cpu", torch.int64)
    if batch is not None and lens.shape[0] != batch:
        raise ValueError(f"{name} holds {lens.shape[0]} lengths, expected {batch}")
    if bool((lens < 0).any()):
        raise ValueError(f"{name} must be >= 0, got {lens.tolist()[:16]}")
    return lens


def _indptr(lens: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lens.shape[0] + 1, dtype=torch.int32)
    out[1:] = lens.cumsum(0)
    return out


def _packed(name: str, offsets, indptr: torch.Tensor, unit: int) -> None:
    """``offsets`` (None, or ``[B+1]`` in tokens or elements) must describe rows packed in
    request order, as the lengths do: other layouts (gaps, padding) are not served here."""
    if offsets is None:
        return
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
        raise ValueError(f"{name} must be a 1-D [batch + 1] tensor")
    got = offsets.to("cpu", torch.int64)
    if got.shape != indptr.shape or not torch.equal(got, indptr.to(torch.int64) * unit):
        raise NotImplementedError(f"{name} describes rows that are not packed in request order "
                                  f"(expected {(indptr.to(torch.int64) * unit).tolist()[:8]}...); "
                                  f"only packed rows are served here")


def cudnn_batch_prefill_with_kv_cache(
        q, k_cache, v_cache, scale, workspace_buffer, *, max_token_per_sequence, max_sequence_kv,
        actual_seq_lens_q=None, actual_seq_lens_kv=None, block_tables=None, causal,
        return_lse, q_scale=None, k_scale=None, v_scale=None, batch_offsets_q=None,
        batch_offsets_o=None, batch_offsets_k=None, batch_offsets_v=None,
        batch_offsets_stats=None, batch_offsets_units="elements", out=None, lse=None,
        is_cuda_graph_compatible=False, backend=None, o_data_type=None):
    """Upstream's cuDNN prefill convention (0.6.18), planned and run on a batch wrapper.

    ``q [total_q, H_qo, D_qk]``, rows packed by request (``actual_seq_lens_q`` ``[B]`` or ``[B,
    1, 1, 1]``, or ``batch_offsets_q`` in tokens with ``batch_offsets_units="tokens"``); paged
    ``k_cache`` / ``v_cache [pages, H_kv, page_size, D]`` through ``block_tables [B,
    pages_per_seq]`` and ``actual_seq_lens_kv``, or, with ``block_tables=None``, packed KV rows
    ``[total_kv, H_kv, D]`` (lengths from ``actual_seq_lens_kv`` or token ``batch_offsets_k``).
    ``causal``: bottom-right aligned (queries at the end of their keys). ``scale``: the softmax
    scale; ``q_scale`` (one element, folded into it), ``k_scale`` / ``v_scale`` (one element)
    for fp8. Returns ``(out [total_q, H_qo, D_vo], lse)``: ``lse`` (``return_lse``) float32
    ``[B, max_token_per_sequence, H_qo]``, natural log, rows past a request's length left as
    given (allocated: ``-inf``). ``batch_offsets_*`` must describe the packed layout (gaps or
    padded rows: ``NotImplementedError``); ``batch_offsets_stats`` and ``backend`` are refused;
    ``is_cuda_graph_compatible`` changes nothing (the lengths are read on the host)."""
    _refuse(batch_offsets_stats=batch_offsets_stats, backend=backend)
    if batch_offsets_units not in ("elements", "tokens"):
        raise ValueError(f"batch_offsets_units must be 'elements' or 'tokens', got "
                         f"{batch_offsets_units!r}")
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be [total_q, H_qo, D_qk], got {tuple(getattr(q, 'shape', ()))}")
    tokens = batch_offsets_units == "tokens"
    if actual_seq_lens_q is not None:
        qo_indptr = _indptr(_lengths("actual_seq_lens_q", actual_seq_lens_q))
    elif tokens and batch_offsets_q is not None:
        qo_indptr = batch_offsets_q.to("cpu", torch.int32)
    else:
        raise ValueError("the query lengths need actual_seq_lens_q (or token-unit batch_offsets_q)")
    batch, heads, d_qk = qo_indptr.shape[0] - 1, q.shape[1], q.shape[2]
    d_vo = v_cache.shape[-1]
    _packed("batch_offsets_q", batch_offsets_q, qo_indptr, 1 if tokens else heads * d_qk)
    _packed("batch_offsets_o", batch_offsets_o, qo_indptr, 1 if tokens else heads * d_vo)
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)
    if batch and int(q_lens.max()) > int(max_token_per_sequence):
        raise ValueError(f"a request has {int(q_lens.max())} query rows, more than "
                         f"max_token_per_sequence={max_token_per_sequence}")
    sm_scale = _scalar("scale", scale) * (1.0 if q_scale is None else _scalar("q_scale", q_scale))
    total = int(qo_indptr[-1])
    common = dict(causal=bool(causal), sm_scale=sm_scale, q_data_type=q.dtype,
                  kv_data_type=k_cache.dtype, o_data_type=o_data_type)
    run_kw = dict(k_scale=k_scale, v_scale=v_scale, out=out, return_lse=bool(return_lse))
    if block_tables is not None:
        kv_lens = (_lengths("actual_seq_lens_kv", actual_seq_lens_kv, batch)
                   if actual_seq_lens_kv is not None
                   else torch.full((batch,), int(max_sequence_kv), dtype=torch.int64))
        page, kv_heads, _, _ = _kv_facts((k_cache, v_cache), "HND")
        indptr, indices, last, _ = page_table(block_tables, kv_lens.to(torch.int32), page)
        wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace_buffer, "HND")
        wrapper.plan(qo_indptr, indptr, indices, last, heads, kv_heads, d_qk, page,
                     head_dim_vo=d_vo, **common)
        result = wrapper.run(q[:total], (k_cache, v_cache), **run_kw)
    else:
        if actual_seq_lens_kv is not None:
            kv_indptr = _indptr(_lengths("actual_seq_lens_kv", actual_seq_lens_kv, batch))
        elif tokens and batch_offsets_k is not None:
            kv_indptr = batch_offsets_k.to("cpu", torch.int32)
        else:
            raise ValueError("a dense KV cache needs actual_seq_lens_kv (or token-unit "
                             "batch_offsets_k)")
        kv_heads = k_cache.shape[1]
        _packed("batch_offsets_k", batch_offsets_k, kv_indptr, 1 if tokens else kv_heads * d_qk)
        _packed("batch_offsets_v", batch_offsets_v, kv_indptr, 1 if tokens else kv_heads * d_vo)
        wrapper = BatchPrefillWithRaggedKVCacheWrapper(workspace_buffer, "NHD")
        wrapper.plan(qo_indptr, kv_indptr, heads, kv_heads, d_qk, head_dim_vo=d_vo, **common)
        rows = int(kv_indptr[-1])
        result = wrapper.run(q[:total], k_cache[:rows], v_cache[:rows], **run_kw)
    if not return_lse:
        return result, None
    o, lse2 = result
    if lse is None:
        lse = torch.full((batch, int(max_token_per_sequence), heads), float("-inf"),
                         dtype=torch.float32, device=q.device)
    req = torch.repeat_interleave(torch.arange(batch), q_lens)
    pos = torch.arange(total) - qo_indptr[:-1].to(torch.int64)[req]
    lse[req.to(q.device), pos.to(q.device)] = lse2 * _LN2
    return o, lse


__all__ = ["cudnn_batch_decode_with_kv_cache", "cudnn_batch_prefill_with_kv_cache", "page_table", "trtllm_batch_context_with_kv_cache", "trtllm_batch_decode_with_kv_cache",
           "xqa_batch_decode_with_kv_cache"]
