"""FlashMLA's dense fp8 decode (the ``batch_mla`` contract) through the ``sgl-flash-mla`` wheel's
legacy SM 9.0 op ``fwd_kvcache_mla_fp8``: an e4m3 latent cache ``[pages, 64, 1, 576]`` read with
one dequantisation scale (``descale_k``) and an e4m3 query with its own (``descale_q``).

The contract's query is 16-bit, so each run quantises it: ``[q_nope | q_pe * kpe_scale /
ckv_scale]`` (the RoPE part's scale folded in, so one ``descale_k = ckv_scale`` serves the whole
token) scaled by its largest magnitude over the batch into e4m3, that scale passed as
``descale_q``. That rounding (3 mantissa bits on q) is an approximation the contract does not
make, so the record is opt-in (asked for by ``backend="flashmla:fp8"``) until its GPU run says
how far it is from the reference. Per-token scales (``ckv_scale_arr``) are not served.

The block table and the page-id checks are the dense decode's (:class:`.decode.FlashMLARunner`,
whose plan-time arrays it shares); the scheduler metadata of the fp8 kernel is its own
(``get_mla_decoding_metadata_dense_fp8``), made by the first run from the planned lengths.
"""

from __future__ import annotations

import torch

from ...attention.mla_params import MLAPlan, MLAScales
from . import legacy_ops
from .decode import FlashMLARunner, _host_arrays

#: the largest finite e4m3 magnitude
E4M3_MAX = 448.0


class FlashMLAFp8Runner(FlashMLARunner):
    makes_output = True

    def __init__(self, plan: MLAPlan):
        super().__init__(plan)
        ops = legacy_ops()
        self.fwd8 = ops.fwd_kvcache_mla_fp8.default
        self.metadata8 = ops.get_mla_decoding_metadata_dense_fp8.default
        self.meta8 = None
        self.descale_k: dict[float, torch.Tensor] = {}

    def _quantised_q(self, q_nope, q_pe, pe_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q e4m3 [B, q_len, H, 576], descale_q float32 [1])``."""
        q = self._q(q_nope, q_pe).float()
        if pe_ratio != 1.0:
            q[..., self.plan.head_dim_ckv:] *= pe_ratio
        scale = (q.abs().amax() / E4M3_MAX).clamp_min(1e-12).reshape(1)
        return (q / scale).to(torch.float8_e4m3fn), scale

    def __call__(self, q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales: MLAScales):
        plan = self.plan
        if scales.ckv_scale is None:
            raise ValueError("backend flashmla:fp8 takes one ckv_scale for the cache (FlashMLA "
                             "dequantises a token with one scale); ckv_scale_arr (per-token "
                             "scales) is served by backend='triton'")
        num_pages = ckv_cache.shape[0]
        q8, descale_q = self._quantised_q(q_nope, q_pe, scales.kpe_scale / scales.ckv_scale)
        descale_k = self.descale_k.get(scales.ckv_scale)
        if descale_k is None:
            descale_k = self.descale_k[scales.ckv_scale] = torch.full(
                (1,), scales.ckv_scale, dtype=torch.float32, device=plan.device)
        if self.meta8 is None:
            self.meta8 = tuple(self.metadata8(plan.kv_len, self.q_len * plan.num_heads, 1))
        o, l_e = self.fwd8(q8, self._joint_cache(ckv_cache), plan.head_dim_ckv, plan.kv_len,
                           self._block_table(num_pages), plan.sm_scale, plan.causal,
                           self.meta8[0], self.meta8[1], descale_q, descale_k)
        return self._finish(o, l_e, out, lse)


def batch_mla(plan: MLAPlan) -> FlashMLAFp8Runner:
    return FlashMLAFp8Runner(plan)


batch_mla.host_arrays = _host_arrays


__all__ = ["FlashMLAFp8Runner", "batch_mla"]
