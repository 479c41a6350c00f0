"""The contract between the MLA wrapper and the backends: plan once, run many.

Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): every query head attends to one shared
latent cache. Token ``t`` of a request holds ``ckv[t]`` (``head_dim_ckv`` wide, 512 for
DeepSeek) and ``kpe[t]`` (``head_dim_kpe`` wide, its RoPE part, 64; 0 for none). For query head
``h`` of query row ``i``::

    s[h, i, t] = (q_nope[i, h] . ckv[t] + q_pe[i, h] . kpe[t]) * sm_scale
    out[i, h]  = softmax_t(s[h, i, :]) @ ckv                 (V is the latent itself)
    lse[i, h]  = log2(sum_t exp(s[h, i, t]))                  (base 2; base e on request)

Request ``b`` has query rows ``qo_indptr[b]:qo_indptr[b+1]`` and ``kv_len[b]`` tokens, token
``t`` in slot ``t % page_size`` of page ``kv_indices[kv_indptr[b] + t // page_size]``. Causal
masks are bottom-right aligned: row ``i`` of ``q_len`` sees tokens ``t <= kv_len - q_len + i``
(a row that sees none gets output 0 and lse ``-inf``). fp8 (e4m3) caches are dequantised as
``ckv * ckv_scale`` (or per token and 128-channel group, ``ckv_scale_arr``) and ``kpe *
kpe_scale``, the same ``ckv`` serving as V.

A backend registers a planner for the op ``batch_mla`` taking an :class:`MLAPlan` and returning a
runner (a planner with an attribute ``host_arrays(plan) -> {name: 1-D int32 numpy array}`` gets
those arrays in ``plan.extra`` on the device, carried by the plan's one host-to-device copy; the
plan it is given then holds the host arrays in its device fields, and a runner built for a plan
whose ``extra`` lacks them uploads them itself)::

    runner(q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales) -> out

with ``q_nope [total_qo, H, head_dim_ckv]``, ``q_pe [total_qo, H, head_dim_kpe]``, ``ckv_cache
[pages, page_size, head_dim_ckv]``, ``kpe_cache [pages, page_size, head_dim_kpe]`` (strided views
of one ``[pages, page_size, 576]`` buffer are fine: the last dim is contiguous), ``out
[total_qo, H, head_dim_ckv]`` in ``plan.o_dtype`` to be fully written (``None`` for a runner
whose ``makes_output`` is true and the caller gave none: it returns its own), ``lse [total_qo,
H]`` float32 base 2 or None, ``scales`` an :class:`MLAScales`. A record without the feature
``separate_caches`` is only run on caches for which :func:`joint_latent` holds.

A record with the feature ``cuda_graph`` serves plans of a CUDA-graph wrapper
(``plan.cuda_graph``): its runner makes no host sync, reads every length and page id from the
plan's device arrays (the wrapper's fixed buffers, rewritten by each plan) and keeps the device
buffers a captured run reads in ``plan.graph_store`` (kept by the wrapper across its plans), so
that a graph captured under one plan replays correctly under a later one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..index_checks import fault

#: the page-id rule a kernel applies to the ids it reads at run time (a CUDA-graph wrapper's
#: fixed buffer may have been rewritten since plan(), which checked the ids it was given)
MLA_PAGE = fault("BatchMLAPagedAttentionWrapper.run", "kv_indices",
                 "a page id in [0, {bound}) (the pages of ckv_cache / kpe_cache)")


@dataclass(eq=False)
class MLAPlan:
    """Everything ``plan()`` fixed. Host arrays are int32 numpy arrays (plan()'s own copies:
    numpy because a torch op on a small CPU tensor costs several microseconds); device arrays
    the same values as tensors on ``device`` (for a CUDA-graph wrapper, its fixed buffers).
    ``plan()`` decides on the plan before the upload (its device fields then hold None, or the
    caller's page ids), then puts the uploaded arrays there (not frozen: a
    ``dataclasses.replace`` costs tens of microseconds per plan on a slow host); runners treat
    it as read-only."""

    device: torch.device
    batch_size: int
    num_heads: int
    head_dim_ckv: int
    head_dim_kpe: int
    page_size: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    o_dtype: torch.dtype
    causal: bool
    sm_scale: float
    qo_indptr_host: np.ndarray  # [B+1]
    kv_indptr_host: np.ndarray  # [B+1] page offsets into kv_indices
    kv_len_host: np.ndarray  # [B] tokens per request
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor  # page ids (at least kv_indptr[-1] of them)
    kv_len: torch.Tensor
    total_qo: int
    max_qo_len: int
    max_kv_len: int
    max_page_id: int | None  # the largest planned page id (-1: none; None: ids on the device,
    # checked by the kernel as it reads them, rule MLA_PAGE)
    cuda_graph: bool = False
    workspace: torch.Tensor | None = None  # the wrapper's float workspace as bytes (scratch)
    kv_indices_host: np.ndarray | None = None  # the page ids, when given on the host
    # arrays the planner of the decided kernel built on the host (its ``host_arrays(plan)``),
    # uploaded with the plan's own in one copy: name -> 1-D int32 device tensor
    extra: dict = field(default_factory=dict)
    # a CUDA-graph wrapper's buffers that outlive its plans (a captured graph keeps reading
    # them): one dict for the wrapper's life, where a runner keeps what it builds on the device
    graph_store: dict | None = None


@dataclass(frozen=True)
class MLAScales:
    """fp8 dequantisation of a run (all None / 1.0 for 16-bit caches): ``ckv_scale`` a float,
    or ``ckv_scale_arr`` float32 ``[pages, page_size, head_dim_ckv // 128]``; ``kpe_scale``."""

    ckv_scale: float | None = None
    ckv_scale_arr: torch.Tensor | None = None
    kpe_scale: float = 1.0


def joint_latent(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``b`` continues ``a`` along the last dim: both views of one ``[..., Da + Db]``
    buffer (``a`` its first ``Da`` channels, ``b`` the rest), as engines keep ``q_nope`` /
    ``q_pe`` and the ckv / kpe caches."""
    sa, sb = a.stride(), b.stride()  # (equal leading strides: equal dims too)
    return (sa[-1] == 1 and sb[-1] == 1 and sa[:-1] == sb[:-1] and a.dtype == b.dtype
            and a.shape[:-1] == b.shape[:-1]
            and b.data_ptr() == a.data_ptr() + a.shape[-1] * a.element_size())


__all__ = ["MLA_PAGE", "MLAPlan", "MLAScales", "joint_latent"]
