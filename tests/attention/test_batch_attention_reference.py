"""The reference batch planners vs float64 attention written here, on random ragged batches."""

import math

import pytest
import torch

from attention_helpers import make_paged, ws
from conftest import poison, rel_error
import flashinfer


def naive(q, ks, vs, qo_lens, hq, hk, scale, causal=False, window=-1, cap=0.0, sinks=None,
          masks=None, k_scale=1.0, v_scale=1.0):
    """float64 per request: returns out [total_qo, hq, dv] and lse base 2 [total_qo, hq]."""
    outs, lses, row = [], [], 0
    g = hq // hk
    for b, (k, v) in enumerate(zip(ks, vs)):
        n, kv_len = qo_lens[b], k.shape[0]
        qb = q[row:row + n].double()
        row += n
        kk = (k.double() * k_scale).repeat_interleave(g, 1)
        vv = (v.double() * v_scale).repeat_interleave(g, 1)
        s = torch.einsum("qhd,khd->hqk", qb, kk) * scale
        if cap > 0:
            s = cap * torch.tanh(s / cap)
        i = torch.arange(n)[:, None] + kv_len - n
        j = torch.arange(kv_len)[None, :]
        keep = torch.ones(n, kv_len, dtype=torch.bool)
        if masks is not None:
            keep = masks[b]
        elif causal:
            keep = j <= i
        if window >= 0:
            keep = keep & (j >= i - window)
        s = s.masked_fill(~keep, float("-inf"))
        m = s.amax(-1, keepdim=True).clamp_min(-1e30)
        w = torch.exp(s - m)
        den = w.sum(-1, keepdim=True)
        lse = (m + torch.log(den)).squeeze(-1) / math.log(2)
        if sinks is not None:
            den = den + torch.exp(sinks.double()[:, None, None] - m)
        o = torch.einsum("hqk,khd->qhd", w / den.clamp_min(1e-300), vv)
        outs.append(o)
        lses.append(lse.t())
    return torch.cat(outs), torch.cat(lses)


DECODE = {
    "basic": dict(ps=16, lens=[1, 15, 16, 17, 40], hq=4, hk=4),
    "gqa_page1": dict(ps=1, lens=[1, 7, 20], hq=8, hk=2),
    "hnd_window_cap": dict(ps=16, lens=[33, 5, 64], hq=4, hk=2, layout="HND", window=9, cap=20.0),
    "sinks": dict(ps=16, lens=[17, 3], hq=4, hk=1, sinks=True),
    "fp8": dict(ps=16, lens=[31, 48], hq=4, hk=2, fp8=True),
    "q_len_per_req_2": dict(ps=16, lens=[2, 17, 33], hq=4, hk=2, qlen=2),
}


@pytest.mark.parametrize("case", list(DECODE))
def test_batch_decode_reference(case):
    cfg = DECODE[case]
    torch.manual_seed(1)
    d, hq, hk, layout, qlen = 32, cfg["hq"], cfg["hk"], cfg.get("layout", "NHD"), cfg.get("qlen", 1)
    kv_dtype = torch.float8_e4m3fn if cfg.get("fp8") else torch.float32
    cache, indptr, indices, last, ks, vs = make_paged(cfg["lens"], cfg["ps"], hk, d, layout, kv_dtype)
    bsz = len(cfg["lens"])
    q = torch.randn(bsz * qlen, hq, d)
    sinks = torch.randn(hq) if cfg.get("sinks") else None
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), layout)
    w.plan(indptr, indices, last, hq, hk, d, cfg["ps"], window_left=cfg.get("window", -1),
           logits_soft_cap=cfg.get("cap"), q_data_type=torch.float32, kv_data_type=kv_dtype,
           q_len_per_req=qlen)
    assert w.decision.backend == "reference"
    ksc, vsc = (0.5, 1.5) if cfg.get("fp8") else (None, None)
    out = poison(torch.empty(bsz * qlen, hq, d))
    o, lse = w.run(q, cache, out=out, return_lse=True, sinks=sinks, k_scale=ksc, v_scale=vsc)
    eo, el = naive(q, ks, vs, [qlen] * bsz, hq, hk, d ** -0.5, causal=qlen > 1,
                   window=cfg.get("window", -1), cap=cfg.get("cap", 0.0), sinks=sinks,
                   k_scale=ksc or 1.0, v_scale=vsc or 1.0)
    assert o is out
    assert rel_error(o, eo) < 1e-5
    assert rel_error(lse, el) < 1e-5


PREFILL = {
    "causal": dict(qo=[1, 16, 5], kv=[1, 17, 40], causal=True),
    "causal_gqa_hnd": dict(qo=[3, 15], kv=[15, 33], causal=True, hq=8, hk=2, layout="HND"),
    "window_cap": dict(qo=[7, 4], kv=[20, 4], causal=True, window=5, cap=10.0),
    "noncausal_page1": dict(qo=[4, 2], kv=[9, 3], ps=1),
    "custom_mask": dict(qo=[3, 5], kv=[6, 5], mask=True),
    "sinks_fp8": dict(qo=[5, 2], kv=[17, 16], causal=True, sinks=True, fp8=True),
}


@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("case", list(PREFILL))
def test_batch_prefill_reference(kind, case):
    cfg = PREFILL[case]
    torch.manual_seed(2)
    d, hq, hk, layout, ps = 32, cfg.get("hq", 4), cfg.get("hk", 4), cfg.get("layout", "NHD"), cfg.get("ps", 16)
    kv_dtype = torch.float8_e4m3fn if cfg.get("fp8") else torch.float32
    qo_indptr = torch.tensor([0] + torch.tensor(cfg["qo"]).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(qo_indptr[-1]), hq, d)
    masks = [torch.rand(n, m) > 0.4 for n, m in zip(cfg["qo"], cfg["kv"])] if cfg.get("mask") else None
    flat = torch.cat([m.flatten() for m in masks]) if masks else None
    sinks = torch.randn(hq) if cfg.get("sinks") else None
    common = dict(custom_mask=flat, causal=cfg.get("causal", False), window_left=cfg.get("window", -1),
                  logits_soft_cap=cfg.get("cap"), q_data_type=torch.float32, kv_data_type=kv_dtype)
    if kind == "paged":
        cache, indptr, indices, last, ks, vs = make_paged(cfg["kv"], ps, hk, d, layout, kv_dtype)
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws(), layout)
        w.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, **common)
        args = (cache,)
    else:
        ks = [torch.randn(n, hk, d).to(kv_dtype) for n in cfg["kv"]]
        vs = [torch.randn(n, hk, d).to(kv_dtype) for n in cfg["kv"]]
        kv_indptr = torch.tensor([0] + torch.tensor(cfg["kv"]).cumsum(0).tolist(), dtype=torch.int32)
        k, v = torch.cat(ks), torch.cat(vs)
        if layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws(), layout)
        w.plan(qo_indptr, kv_indptr, hq, hk, d, **common)
        args = (k, v)
    assert w.decision.backend == "reference"
    ksc, vsc = (2.0, 0.25) if cfg.get("fp8") else (None, None)
    o, lse = w.run(q, *args, return_lse=True, sinks=sinks, k_scale=ksc, v_scale=vsc)
    eo, el = naive(q, ks, vs, cfg["qo"], hq, hk, d ** -0.5, causal=cfg.get("causal", False),
                   window=cfg.get("window", -1), cap=cfg.get("cap", 0.0), sinks=sinks, masks=masks,
                   k_scale=ksc or 1.0, v_scale=vsc or 1.0)
    assert rel_error(o, eo) < 1e-5
    finite = torch.isfinite(el)
    assert torch.equal(torch.isfinite(lse), finite)
    assert rel_error(lse[finite], el[finite]) < 1e-5


def test_ragged_head_dim_192_128_and_o_dtype():
    torch.manual_seed(3)
    qo, kv = [3, 4], [5, 4]
    qo_indptr = torch.tensor([0, 3, 7], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 5, 9], dtype=torch.int32)
    q = torch.randn(7, 2, 24)
    k, v = torch.randn(9, 2, 24), torch.randn(9, 2, 16)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws())
    w.plan(qo_indptr, kv_indptr, 2, 2, 24, 16, causal=True, q_data_type=torch.float32,
           o_data_type=torch.bfloat16)
    o = w.run(q, k, v)
    assert o.dtype == torch.bfloat16 and o.shape == (7, 2, 16)
    eo, _ = naive(q, [k[:5], k[5:]], [v[:5], v[5:]], qo, 2, 2, 24 ** -0.5, causal=True)
    assert rel_error(o, eo) < 1e-2


def test_packed_custom_mask_matches_bool_mask():
    torch.manual_seed(4)
    qo, kv = [3, 2], [5, 7]
    masks = [torch.rand(n, m) > 0.5 for n, m in zip(qo, kv)]
    packed = []
    for m in masks:
        bits = torch.cat([m.flatten(), torch.zeros((-m.numel()) % 8, dtype=torch.bool)]).view(-1, 8)
        packed.append((bits.to(torch.int32) << torch.arange(8)).sum(1).to(torch.uint8))
    qo_indptr = torch.tensor([0, 3, 5], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = torch.randn(5, 2, 16), torch.randn(12, 2, 16), torch.randn(12, 2, 16)
    outs = []
    for kw in (dict(custom_mask=torch.cat([m.flatten() for m in masks])),
               dict(packed_custom_mask=torch.cat(packed))):
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws())
        w.plan(qo_indptr, kv_indptr, 2, 2, 16, q_data_type=torch.float32, **kw)
        outs.append(w.run(q, k, v))
    assert torch.equal(outs[0], outs[1])
