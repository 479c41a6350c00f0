"""What a paged wrapper's ``_cached_module`` is after its first ``plan()``: upstream's compiled
plan module, whose ``plan(*args)`` engines call directly in their CUDA-graph fast paths, after
writing the page ids into the wrapper's fixed ``_paged_kv_indices_buf`` (vLLM's decode;
SGLang's ``fast_prefill_plan`` for the paged prefill wrapper). Here ``plan(*args)`` re-plans the
wrapper from those arguments and buffers, with the previous plan's dtypes, scale, soft cap and
positional encoding (upstream's module is compiled for them), and returns ``_plan_info``. Upstream's two positional forms:

* tensor-core / prefill: ``(float_ws, int_ws, pinned_ws, qo_indptr_host, kv_indptr_host,
  kv_lens_host, total_rows, batch, H_qo, H_kv, page_size, cuda_graph, head_dim_qk,
  head_dim_vo, causal[, window_left, fixed_split_size, disable_split_kv, ...])`` — a decode
  wrapper reads its page layout from it, a prefill wrapper also the query rows and ``causal``;
* CUDA-core (decode only): ``(float_ws, int_ws, pinned_ws, kv_indptr_host, batch, H_qo, H_kv,
  page_size, cuda_graph, window_left, logits_soft_cap, head_dim_qk, head_dim_vo, empty_q,
  empty_kv)`` (the last page lengths are then read from ``_paged_kv_last_page_len_buf``).

A prefill wrapper's multi-item arguments are the ones the engine left on the wrapper
(``_prefix_len_ptr``, ``_token_pos_in_items_ptr``, ``_token_pos_in_items_len``,
``_max_item_len_ptr``, as SGLang sets them before the call), when it set any.
"""

from __future__ import annotations

import torch

__all__ = ["PlanModule"]

_MULTI_ITEM = ("prefix_len_ptr", "token_pos_in_items_ptr", "token_pos_in_items_len",
               "max_item_len_ptr")


class PlanModule:
    """``wrapper._cached_module`` (see the module note)."""

    def __init__(self, wrapper):
        self._wrapper = wrapper

    def plan(self, *args):
        w = self._wrapper
        before = w._plan
        if before is None:
            raise RuntimeError("_cached_module.plan() needs the wrapper planned once with plan()")
        decode = before.op == "batch_decode"
        if len(args) >= 15 and isinstance(args[5], torch.Tensor):  # tensor-core / prefill form
            qo_indptr, indptr, kv_lens = args[3], args[4], args[5]
            heads, kv_heads, page_size = args[8:11]
            head_dim, head_dim_vo, causal = args[12], args[13], bool(args[14])
            window_left = args[15] if len(args) > 15 else w._window_left
            last = _last_page_lens(indptr, kv_lens, int(page_size))
        elif decode and len(args) == 15 and isinstance(args[3], torch.Tensor):  # CUDA-core form
            indptr, batch, heads, kv_heads, page_size = args[3:8]
            window_left, head_dim = args[9], args[11]
            if w._paged_kv_last_page_len_buf is None:
                raise RuntimeError("_cached_module.plan() in the CUDA-core form reads the last "
                                   "page lengths from the wrapper's fixed buffer; it has none")
            last = w._paged_kv_last_page_len_buf[:int(batch)].cpu()
        else:
            forms = "tensor-core (15+) or CUDA-core (15)" if decode else "prefill (15+)"
            raise TypeError(f"_cached_module.plan() takes upstream's {forms} positional forms, "
                            f"got {len(args)} arguments")
        if w._paged_kv_indices_buf is None:
            raise RuntimeError("_cached_module.plan() reads the page ids from the wrapper's fixed "
                               "_paged_kv_indices_buf (a CUDA-graph wrapper); it has none")
        indices = w._paged_kv_indices_buf[:int(indptr[-1])]
        same = dict(window_left=int(window_left), logits_soft_cap=before.logits_soft_cap or None,
                    q_data_type=w._fp8_q or before.q_dtype, kv_data_type=before.kv_dtype,
                    o_data_type=before.o_dtype, sm_scale=before.sm_scale,
                    pos_encoding_mode=w._pos_encoding_mode, rope_scale=w._rope_scale,
                    rope_theta=w._rope_theta)  # (as planned: a RoPE plan runs on a rotated one)
        if decode:
            w.plan(indptr, indices, last, int(heads), int(kv_heads), int(head_dim),
                   int(page_size), q_len_per_req=before.q_len_per_req, **same)
        else:
            items = {name: getattr(w, "_" + name, None) for name in _MULTI_ITEM}
            if items["token_pos_in_items_len"] is None:
                items["token_pos_in_items_len"] = 0
            w.plan(qo_indptr, indptr, indices, last, int(heads), int(kv_heads), int(head_dim),
                   int(page_size), head_dim_vo=int(head_dim_vo), causal=causal, **same,
                   **items)
        return w._plan_info


def _last_page_lens(indptr: torch.Tensor, kv_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    """int32 host ``[batch]`` entries of the last page of each request (0 without pages)."""
    pages = (indptr[1:] - indptr[:-1]).to(torch.int64).cpu()
    last = kv_lens.to(torch.int64).cpu() - (pages - 1).clamp_min(0) * page_size
    return torch.where(pages > 0, last, 0).to(torch.int32)
