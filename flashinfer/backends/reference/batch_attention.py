"""Reference planners for ``batch_decode``, ``batch_prefill_paged`` and ``batch_prefill_ragged``.

Each request runs through the single-request reference math
(:func:`~flashinfer.backends.reference.attention.attention`, float32) with its own causal /
window / soft-cap / custom mask and positional encoding (ROPE_LLAMA: query row ``r`` at position
``kv_len - qo_len + r``, key ``j`` at ``j``; ALIBI: upstream's slopes, bias ``slope * (j - i)``); this module adds what the batch contract has on top: the page
gather, FP8 dequantisation (``k_scale`` into the softmax scale, ``v_scale`` on the output),
``q_scale`` and attention sinks (``out *= S / (S + exp(sink))`` with ``S = 2**lse``, i.e. a
sigmoid of ``lse * ln 2 - sink``; the lse itself excludes the sink).

The runner loops over requests in Python with the plan's *host* index arrays, so it never
synchronises; page ids are read from the device copy (``index_select``). It is the oracle, not
fast, and not CUDA-graph safe (a replay would keep the captured lengths): its record lists every
feature (the oracle) but its adapter check rejects ``cuda_graph`` on CUDA.
"""

from __future__ import annotations

import math

import torch

from ...attention.params import AttentionParams, cached_alibi_slopes
from ...attention.batch_params import BatchPlan, KVInput, RunScales
from ...reasons import Reason
from ..shared.paged_mapping import block_sparse as block_sparse_paged  # noqa: F401 (a record's kernel)
from .attention import attention

_LN2 = math.log(2.0)


def _paged_rows(cache: torch.Tensor, pages: torch.Tensor, kv_len: int, layout: str) -> torch.Tensor:
    """Gather ``pages`` of a 4-D page view into NHD rows ``[kv_len, H, D]``."""
    blocks = cache.index_select(0, pages)
    if layout == "HND":
        blocks = blocks.transpose(1, 2)
    return blocks.reshape(-1, blocks.shape[2], blocks.shape[3])[:kv_len]


class ReferenceRunner:
    def __init__(self, plan: BatchPlan):
        self.plan = plan
        self.qo = plan.qo_indptr_host.tolist()
        self.kv = plan.kv_indptr_host.tolist()
        self.kv_lens = plan.kv_lens_host.tolist()
        self.mask = plan.mask_indptr_host.tolist() if plan.mask_indptr_host is not None else None
        self.slopes = (cached_alibi_slopes(plan.num_qo_heads, plan.device)
                       if plan.pos_encoding_mode == "ALIBI" else None)

    def _kv(self, kv: KVInput, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        plan, kv_len = self.plan, self.kv_lens[b]
        if plan.op == "batch_prefill_ragged":
            start = self.kv[b]
            return kv.k[start:start + kv_len], kv.v[start:start + kv_len]
        pages = plan.kv_indices[self.kv[b]:self.kv[b + 1]].long()
        return (_paged_rows(kv.k, pages, kv_len, plan.kv_layout),
                _paged_rows(kv.v, pages, kv_len, plan.kv_layout))

    def __call__(self, q: torch.Tensor, kv: KVInput, out: torch.Tensor, lse: torch.Tensor | None,
                 scales: RunScales) -> None:
        plan = self.plan
        scale = plan.sm_scale * scales.q_scale * scales.k_scale
        for b in range(plan.batch_size):
            q0, q1 = self.qo[b], self.qo[b + 1]
            if q1 == q0:
                continue
            kv_len = self.kv_lens[b]
            if kv_len == 0:
                out[q0:q1] = 0
                if lse is not None:
                    lse[q0:q1] = float("-inf")
                continue
            k, v = self._kv(kv, b)
            mask = None
            if plan.custom_mask is not None:
                mask = plan.custom_mask[self.mask[b]:self.mask[b + 1]].view(q1 - q0, kv_len)
            params = AttentionParams(sm_scale=scale, causal=plan.causal, window_left=plan.window_left,
                                     logits_soft_cap=plan.logits_soft_cap, custom_mask=mask,
                                     return_lse=True, o_dtype=torch.float32,
                                     pos_encoding_mode=plan.pos_encoding_mode,
                                     rope_scale=plan.rope_scale, rope_theta=plan.rope_theta,
                                     alibi_slopes=self.slopes)
            o, l2 = attention(q[q0:q1], k.float(), v.float(), params)
            if scales.sinks is not None:
                o = o * torch.sigmoid(l2 * _LN2 - scales.sinks.float()[None, :])[..., None]
            if scales.v_scale != 1.0:
                o = o * scales.v_scale
            out[q0:q1] = o.to(out.dtype)
            if lse is not None:
                lse[q0:q1] = l2


def no_cuda_graph(problem) -> list[Reason]:
    if "cuda_graph" in problem.features:
        return [Reason("feature", "cuda_graph", "eager runs only",
                       "reference batch attention loops over requests on the host: a CUDA-graph "
                       "replay would reuse the captured lengths")]
    return []



def batch_decode(plan: BatchPlan) -> ReferenceRunner:
    return ReferenceRunner(plan)


def batch_prefill_paged(plan: BatchPlan) -> ReferenceRunner:
    return ReferenceRunner(plan)


def batch_prefill_ragged(plan: BatchPlan) -> ReferenceRunner:
    return ReferenceRunner(plan)
