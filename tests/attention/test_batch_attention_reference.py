"""The reference batch planners vs float64 attention written here, on random ragged batches."""

import math

import pytest
import torch

from attention_helpers import make_paged, ws
from conftest import poison, rel_error, rope_oracle
import flashinfer


def alibi_slopes64(n):
    """ALiBi head slopes: a geometric series from 2**(-8/m) for the m = 2**floor(log2 n) first
    heads, the odd terms of the 2m series for the rest."""
    m = 2 ** math.floor(math.log2(n))
    slopes = [2 ** (-8 * (i + 1) / m) for i in range(m)]
    slopes += [2 ** (-4 * (2 * i + 1) / m) for i in range(n - m)]
    return torch.tensor(slopes, dtype=torch.float64)


def naive(q, ks, vs, qo_lens, hq, hk, scale, causal=False, window=-1, cap=0.0, sinks=None,
          masks=None, k_scale=1.0, v_scale=1.0, pos="NONE", rope_scale=1.0, rope_theta=1e4):
    """float64 per request: returns out [total_qo, hq, dv] and lse base 2 [total_qo, hq].
    ``pos``: ROPE_LLAMA rotates query row r at kv_len - n + r and key j at j; ALIBI adds
    slope_h * (j - r)."""
    outs, lses, row = [], [], 0
    g = hq // hk
    for b, (k, v) in enumerate(zip(ks, vs)):
        n, kv_len = qo_lens[b], k.shape[0]
        qb = q[row:row + n].double()
        row += n
        if kv_len == 0:  # no key: out 0, lse -inf
            outs.append(torch.zeros(n, hq, v.shape[-1], dtype=torch.float64))
            lses.append(torch.full((n, hq), float("-inf"), dtype=torch.float64))
            continue
        kk = k.double().repeat_interleave(g, 1)
        vv = (v.double() * v_scale).repeat_interleave(g, 1)
        if pos == "ROPE_LLAMA":
            d = qb.shape[-1]
            qb = rope_oracle(qb, torch.arange(kv_len - n, kv_len), d, False, rope_scale, rope_theta)
            kk = rope_oracle(kk, torch.arange(kv_len), d, False, rope_scale, rope_theta)
        kk = kk * k_scale
        s = torch.einsum("qhd,khd->hqk", qb, kk) * scale
        if pos == "ALIBI":
            s = s + alibi_slopes64(hq)[:, None, None] * (
                torch.arange(kv_len)[None, :] - torch.arange(n)[:, None]).double()
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


POSITIONS = {
    "rope": dict(pos="ROPE_LLAMA"),
    "rope_scaled": dict(pos="ROPE_LLAMA", rope_scale=2.0, rope_theta=5e5),
    "alibi": dict(pos="ALIBI"),
}


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("case", list(POSITIONS))
def test_batch_positional_encodings_match_naive(case, layout):
    """pos_encoding_mode in the three wrappers (the reference applies it: no other backend
    declares it yet), against float64 math; hq = 6 gives ALiBi's non-power-of-two slopes."""
    cfg = POSITIONS[case]
    torch.manual_seed(4)
    d, hq, hk, ps = 32, 6, 2, 16
    rope = dict(rope_scale=cfg.get("rope_scale"), rope_theta=cfg.get("rope_theta"))
    naive_pos = dict(pos=cfg["pos"], rope_scale=cfg.get("rope_scale", 1.0),
                     rope_theta=cfg.get("rope_theta", 1e4))
    kv_lens, qo_lens = [5, 33, 17], [2, 7, 1]
    cache, indptr, indices, last, ks, vs = make_paged(kv_lens, ps, hk, d, layout)
    # decode
    q = torch.randn(len(kv_lens), hq, d)
    dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), layout)
    dec.plan(indptr, indices, last, hq, hk, d, ps, pos_encoding_mode=cfg["pos"],
             q_data_type=torch.float32, **rope)
    assert "rope_llama" in dec.decision.problem.features or cfg["pos"] == "ALIBI"
    assert dec._pos_encoding_mode == cfg["pos"]
    o, lse = dec.run(q, cache, return_lse=True)
    eo, el = naive(q, ks, vs, [1] * 3, hq, hk, d ** -0.5, **naive_pos)
    assert rel_error(o, eo) < 1e-5 and rel_error(lse, el) < 1e-5
    # paged and ragged prefill, causal
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(qo_indptr[-1]), hq, d)
    eo, el = naive(q, ks, vs, qo_lens, hq, hk, d ** -0.5, causal=True, **naive_pos)
    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws(), layout)
    paged.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, causal=True,
               pos_encoding_mode=cfg["pos"], q_data_type=torch.float32, **rope)
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws(), layout)
    kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
    ragged.plan(qo_indptr, kv_indptr, hq, hk, d, causal=True, pos_encoding_mode=cfg["pos"],
                q_data_type=torch.float32, **rope)
    k, v = torch.cat(ks), torch.cat(vs)
    if layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    for w, args in ((paged, (cache,)), (ragged, (k, v))):
        assert w.decision.backend == "reference"
        o, lse = w.run(q, *args, return_lse=True)
        assert rel_error(o, eo) < 1e-5 and rel_error(lse, el) < 1e-5


def test_batch_positional_encoding_accepts_upstreams_enum_values_and_forward_replans():
    torch.manual_seed(5)
    cache, indptr, indices, last, ks, vs = make_paged([9, 4], 4, 2, 16, "NHD")
    q = torch.randn(2, 2, 16)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    w.plan(indptr, indices, last, 2, 2, 16, 4, pos_encoding_mode=2, q_data_type=torch.float32)
    assert w._pos_encoding_mode == "ALIBI"
    alibi = w.run(q, cache)
    torch.testing.assert_close(alibi, naive(q, ks, vs, [1, 1], 2, 2, 0.25, pos="ALIBI")[0].float())
    with pytest.warns(DeprecationWarning, match="re-plans"):
        rotated = w.forward(q, cache, pos_encoding_mode="ROPE_LLAMA")
    assert w._pos_encoding_mode == "ROPE_LLAMA"
    torch.testing.assert_close(rotated,
                               naive(q, ks, vs, [1, 1], 2, 2, 0.25, pos="ROPE_LLAMA")[0].float())


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float8_e4m3fn])
def test_rotated_batch_plans_match_naive(monkeypatch, layout, kv_dtype):
    """The rotation path of ROPE_LLAMA (attention/batch_rope.py: gather the keys into rows,
    rotate q and k, run a ragged plan without positional encoding), forced here with the
    reference as the plain kernel (no other batch kernel runs on a CPU)."""
    from flashinfer.attention import positions

    monkeypatch.setattr(positions, "runs_rotated", lambda decision: True)
    torch.manual_seed(6)
    d, hq, hk, ps = 32, 4, 2, 8
    rope = dict(rope_scale=2.0, rope_theta=5e4)
    kv_lens, qo_lens = [5, 30, 0, 17], [2, 7, 0, 1]
    cache, indptr, indices, last, ks, vs = make_paged(kv_lens, ps, hk, d, layout, kv_dtype)
    ksc, vsc = (0.5, 2.0) if kv_dtype != torch.float32 else (None, None)
    scales = dict(k_scale=ksc or 1.0, v_scale=vsc or 1.0)
    q = torch.randn(len(kv_lens), hq, d)
    dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), layout)
    dec.plan(indptr, indices, last, hq, hk, d, ps, pos_encoding_mode="ROPE_LLAMA",
             q_data_type=torch.float32, kv_data_type=kv_dtype, **rope)
    assert dec._rotation is not None and "rope_llama" not in dec.decision.problem.features
    o, lse = dec.run(q, cache, return_lse=True, k_scale=ksc, v_scale=vsc)
    eo, el = naive(q, ks, vs, [1] * 4, hq, hk, d ** -0.5, pos="ROPE_LLAMA", **rope, **scales)
    assert rel_error(o, eo) < 1e-5 and bool((o[2] == 0).all())  # request 2 has no key
    assert torch.equal(lse.isinf(), el.isinf()) and rel_error(lse[[0, 1, 3]], el[[0, 1, 3]]) < 1e-5
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    qp = torch.randn(int(qo_indptr[-1]), hq, d)
    eo, el = naive(qp, ks, vs, qo_lens, hq, hk, d ** -0.5, causal=True, pos="ROPE_LLAMA", **rope,
                   **scales)
    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws(), layout)
    paged.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, causal=True,
               pos_encoding_mode="ROPE_LLAMA", q_data_type=torch.float32, kv_data_type=kv_dtype,
               **rope)
    assert paged._rotation is not None
    o, lse = paged.run(qp, cache, return_lse=True, k_scale=ksc, v_scale=vsc)
    assert rel_error(o, eo) < 1e-5
    if kv_dtype == torch.float32:
        ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws(), layout)
        kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
        ragged.plan(qo_indptr, kv_indptr, hq, hk, d, causal=True, pos_encoding_mode="ROPE_LLAMA",
                    q_data_type=torch.float32, **rope)
        k, v = torch.cat(ks), torch.cat(vs)
        if layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        assert ragged._rotation is not None
        assert rel_error(ragged.run(qp, k, v), eo) < 1e-5


@pytest.mark.parametrize("shape", ["one", "per_head"])
def test_tensor_scales_per_tensor_and_per_kv_head(shape):
    """k_scale / v_scale as device tensors (attention/scales.py): k_scale folded into the query
    heads of each KV head, v_scale on the output heads; against float64 with the scales
    applied per KV head."""
    torch.manual_seed(8)
    d, hq, hk, ps = 16, 4, 2, 4
    cache, indptr, indices, last, ks, vs = make_paged([6, 13], ps, hk, d, "NHD",
                                                      torch.float8_e4m3fn)
    q = torch.randn(2, hq, d)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    w.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=torch.float32,
           kv_data_type=torch.float8_e4m3fn)
    if shape == "one":
        k_scale, v_scale = torch.tensor([0.5]), torch.tensor(2.0)
        k_heads, v_heads = torch.tensor([0.5, 0.5]), torch.tensor([2.0, 2.0])
    else:
        k_heads, v_heads = torch.tensor([0.5, 1.5]), torch.tensor([2.0, 0.25])
        k_scale, v_scale = k_heads, v_heads
    o, lse = w.run(q, cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)
    ks_scaled = [k.double() * k_heads.double()[None, :, None] for k in ks]
    vs_scaled = [v.double() * v_heads.double()[None, :, None] for v in vs]
    eo, el = naive(q, ks_scaled, vs_scaled, [1, 1], hq, hk, d ** -0.5)
    assert rel_error(o, eo) < 1e-5 and rel_error(lse, el) < 1e-5
    if shape == "one":  # the same as float scales
        torch.testing.assert_close(o, w.run(q, cache, k_scale=0.5, v_scale=2.0))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_queries_run_widened_to_the_output_dtype(dtype):
    """q_data_type fp8 (with o_data_type 16-bit): run() takes the fp8 q and gives exactly what a
    16-bit plan gives on q widened (q_scale still multiplies the softmax scale)."""
    torch.manual_seed(9)
    cache, indptr, indices, last, ks, vs = make_paged([9, 20], 4, 2, 16, "NHD", torch.float8_e4m3fn)
    q = torch.randn(2, 4, 16).to(dtype)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    w.plan(indptr, indices, last, 4, 2, 16, 4, q_data_type=dtype,
           kv_data_type=torch.float8_e4m3fn, o_data_type=torch.bfloat16)
    ref = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    ref.plan(indptr, indices, last, 4, 2, 16, 4, q_data_type=torch.bfloat16,
             kv_data_type=torch.float8_e4m3fn)
    args = dict(q_scale=0.5, k_scale=2.0, v_scale=1.5)
    got = w.run(q, cache, **args)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, ref.run(q.to(torch.bfloat16), cache, **args))
    qo_indptr = torch.tensor([0, 3, 8], dtype=torch.int32)
    qp = torch.randn(8, 4, 16).to(dtype)
    p = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws())
    p.plan(qo_indptr, indptr, indices, last, 4, 2, 16, 4, causal=True, q_data_type=dtype,
           kv_data_type=torch.float8_e4m3fn, o_data_type=torch.float16)
    rp = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws())
    rp.plan(qo_indptr, indptr, indices, last, 4, 2, 16, 4, causal=True,
            q_data_type=torch.float16, kv_data_type=torch.float8_e4m3fn)
    assert torch.equal(p.run(qp, cache, **args), rp.run(qp.to(torch.float16), cache, **args))
    with pytest.raises(ValueError, match="needs o_data_type"):
        w.plan(indptr, indices, last, 4, 2, 16, 4, q_data_type=dtype)
    with pytest.raises(ValueError, match="differs from the planned"):
        ref.run(q, cache)  # a 16-bit plan does not take fp8 queries
