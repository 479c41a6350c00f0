"""FlashMLA's dense fp8 decode runner (flashinfer/backends/flashmla/fp8.py) on the CPU: the wheel's
ops replaced by a float64 model of them (q and the cache dequantised by their descales, the
block table walked, softmax in float64), so the query quantisation, the RoPE scale folded into
q_pe, the block table, the metadata call and the lse conversion are checked against naive MLA
of the dequantised cache (to e4m3's rounding of q). The kernel itself: tests/attention/test_mla_gpu.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import rel_error
from mla_helpers import _case, _plan, naive
import flashinfer.backends.flashmla.decode as dense
import flashinfer.backends.flashmla.fp8 as fp8
from flashinfer.attention.mla_params import MLAScales
from flashinfer.dispatch import kernel_for

E4M3 = torch.float8_e4m3fn
SCALE = 0.11


def _model_fwd8(q8, k, head_dim_v, seqlens, table, scale, causal, meta, splits, descale_q,
                descale_k):
    """``(out [B, s_q, H, Dv] bf16, lse [B, H, s_q])`` of the fp8 dense decode, in float64."""
    assert q8.dtype == E4M3 and k.dtype == E4M3 and meta == "meta" and splits == "splits"
    b_, s_q, heads, _ = q8.shape
    page = k.shape[1]
    q = q8.double() * float(descale_q)
    out = torch.zeros(b_, s_q, heads, head_dim_v, dtype=torch.float64)
    lse = torch.full((b_, heads, s_q), math.inf, dtype=torch.float64)
    for b in range(b_):
        n = int(seqlens[b])
        tok = torch.stack([k[int(table[b, t // page]), t % page, 0].double() for t in range(n)])
        tok = tok * float(descale_k)
        for i in range(s_q):
            s = q[b, i] @ tok.T * scale  # [H, n]
            if causal:
                s[:, n - s_q + i + 1:] = -math.inf
            lse[b, :, i] = torch.logsumexp(s, -1)
            out[b, i] = torch.softmax(s, -1) @ tok[:, :head_dim_v]
    return out.to(torch.bfloat16), lse.float()


@pytest.fixture
def model_ops(monkeypatch):
    seen = []

    def metadata(seqlens, q_per_k_head, h_k):
        seen.append((q_per_k_head, h_k))
        return "meta", "splits"
    ops = SimpleNamespace(fwd_kvcache_mla_fp8=SimpleNamespace(default=_model_fwd8),
                          get_mla_decoding_metadata_dense_fp8=SimpleNamespace(default=metadata),
                          dense_decode_fwd=SimpleNamespace(default=None))
    monkeypatch.setattr(fp8, "legacy_ops", lambda: ops)
    monkeypatch.setattr(dense, "legacy_ops", lambda: ops)
    return seen


@pytest.mark.parametrize("q_len,causal", [(1, False), (2, True)])
def test_matches_naive_mla_of_the_dequantised_cache(q_len, causal, model_ops):
    heads, page = 4, 64
    arrays, t = _case([q_len] * 3, [5, 64, 130], page_size=page, heads=heads, ckv=32, kpe=8,
                      seed=q_len)
    joint = torch.cat([t["ckv_cache"], t["kpe_cache"]], -1).to(E4M3)
    q = torch.cat([t["q_nope"], t["q_pe"]], -1).to(torch.bfloat16)
    plan = _plan(arrays, page, causal, SCALE, heads=heads, ckv=32, kpe=8)._plan
    plan.q_dtype = plan.o_dtype = torch.bfloat16
    runner = kernel_for("flashmla", "batch_mla", "fp8")(plan)
    lse = torch.empty(q.shape[0], heads)
    got = runner(q[..., :32], q[..., 32:], joint[..., :32], joint[..., 32:], None, lse,
                 MLAScales(ckv_scale=0.5, kpe_scale=1.5))
    deq = dict(q_nope=q[..., :32].float(), q_pe=q[..., 32:].float(),
               ckv_cache=joint[..., :32].float(), kpe_cache=joint[..., 32:].float())
    want, want_lse = naive(arrays, deq, page, causal, SCALE, ckv_scale=0.5, kpe_scale=1.5)
    assert rel_error(got.float(), want) < 0.05  # q rounded to e4m3 (3 mantissa bits)
    assert rel_error(lse, want_lse) < 0.02
    assert model_ops == [(q_len * heads, 1)]  # metadata once, for the planned lengths


def test_per_token_scales_are_refused(model_ops):
    arrays, t = _case([1], [10], page_size=64, heads=4, ckv=32, kpe=8, seed=5)
    plan = _plan(arrays, 64, False, SCALE, heads=4, ckv=32, kpe=8)._plan
    runner = kernel_for("flashmla", "batch_mla", "fp8")(plan)
    with pytest.raises(ValueError, match="ckv_scale_arr"):
        runner(t["q_nope"], t["q_pe"], t["ckv_cache"], t["kpe_cache"], None, None,
               MLAScales(ckv_scale_arr=torch.ones(1, 64, 1), kpe_scale=1.0))
