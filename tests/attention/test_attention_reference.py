"""Single-request attention, reference backend vs float64 math written here.

Covers every feature of AttentionParams through the public functions (GQA, NHD/HND, bottom-right
causal, window, soft cap, ALiBi, in-kernel RoPE, custom and packed masks, base-2 lse,
head_dim_qk != head_dim_vo, rows that see no key), decode == prefill with one query row, the
scales, o_dtype, strided inputs and the reference's row chunking.
"""

import functools
import math

import pytest
import torch

from conftest import TOLERANCE, rel_error
from flashinfer.attention.params import get_alibi_slopes
from flashinfer.backends.reference import attention as ref_attention
from flashinfer.decode import single_decode_with_kv_cache
from flashinfer.prefill import single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse


# --- float64 oracle ------------------------------------------------------------------------

def naive_slopes(n):
    p = 2 ** int(math.floor(math.log2(n)))
    slopes = [2.0 ** (-8.0 * (h + 1) / p) for h in range(p)]
    slopes += [2.0 ** (-4.0 * (2 * m + 1) / p) for m in range(n - p)]
    return torch.tensor(slopes, dtype=torch.float64)


def naive_rope(x, pos, scale, theta):
    """x [n, H, d] float64, non-interleaved rotation of (x[t], x[t + d/2])."""
    d = x.shape[-1]
    out = x.clone()
    for t in range(d // 2):
        ang = pos.double() / scale * theta ** (-2.0 * t / d)
        c, s = ang.cos()[:, None], ang.sin()[:, None]
        out[..., t] = x[..., t] * c - x[..., t + d // 2] * s
        out[..., t + d // 2] = x[..., t + d // 2] * c + x[..., t] * s
    return out


def naive_attention(q, k, v, *, causal=False, window_left=-1, cap=0.0, alibi=False, rope=None,
                    mask=None, sm_scale=None):
    """q [Lq, Hq, D], k [Lk, Hk, D], v [Lk, Hk, Dv] (NHD) -> out [Lq, Hq, Dv], lse2 [Lq, Hq]."""
    q, k, v = q.double(), k.double(), v.double()
    lq, hq, d = q.shape
    lk, hk, _ = k.shape
    if rope is not None:
        q = naive_rope(q, torch.arange(lk - lq, lk), *rope)
        k = naive_rope(k, torch.arange(lk), *rope)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    out = torch.zeros(lq, hq, v.shape[-1], dtype=torch.float64)
    lse = torch.full((lq, hq), float("-inf"), dtype=torch.float64)
    slopes = naive_slopes(hq)
    for h in range(hq):
        kh = h // (hq // hk)
        for r in range(lq):
            i = lk - lq + r
            s = (k[:, kh] @ q[r, h]) * scale
            if alibi:
                s = s + slopes[h] * (torch.arange(lk, dtype=torch.float64) - r)
            if cap > 0:
                s = cap * torch.tanh(s / cap)
            keep = torch.ones(lk, dtype=torch.bool)
            if mask is not None:
                keep = mask[r].clone()
            elif causal:
                keep = torch.arange(lk) <= i
            if window_left >= 0:
                keep &= torch.arange(lk) >= i - window_left
            if not keep.any():
                continue
            sv = s[keep]
            p = torch.exp(sv - sv.max())
            out[r, h] = (p[:, None] * v[keep, kh]).sum(0) / p.sum()
            lse[r, h] = (sv.max() + p.sum().log()) / math.log(2.0)
    return out, lse


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


def to_layout(t, layout):
    return t if layout == "NHD" else t.transpose(0, 1).contiguous()


def assert_lse_close(lse, expected, tol=1e-5):
    assert lse.dtype == torch.float32
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isneginf(lse), ~finite)
    if finite.any():
        assert rel_error(lse[finite], expected[finite]) <= tol


# --- prefill vs float64, every feature -----------------------------------------------------

CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "causal_more_queries_than_keys": dict(causal=True, qo_len=11, kv_len=6),
    "window": dict(window_left=3),
    "causal_window": dict(causal=True, window_left=2),
    "soft_cap": dict(logits_soft_cap=2.0),
    "alibi": dict(pos_encoding_mode="ALIBI"),
    "alibi_causal_window": dict(pos_encoding_mode="ALIBI", causal=True, window_left=4),
    "rope_llama": dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0, rope_theta=500.0),
    "custom_mask": dict(mask=True),
    "custom_mask_window": dict(mask=True, window_left=3),
    "head_dim_differs": dict(head_dim_vo=8),
    "alibi_soft_cap": dict(pos_encoding_mode="ALIBI", logits_soft_cap=3.0, causal=True),
    "sm_scale": dict(sm_scale=0.3),
}


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("case", list(CASES))
def test_prefill_reference_vs_float64(case, heads, layout):
    torch.manual_seed(list(CASES).index(case) * 4 + heads[1] + len(layout))
    cfg = dict(CASES[case])
    qo_len, kv_len = cfg.pop("qo_len", 7), cfg.pop("kv_len", 13)
    head_dim_vo = cfg.pop("head_dim_vo", 16)
    hq, hk = heads
    q, k, v = rand(qo_len, hq, 16), rand(kv_len, hk, 16), rand(kv_len, hk, head_dim_vo)
    mask = (torch.rand(qo_len, kv_len) > 0.4) if cfg.pop("mask", False) else None
    if mask is not None:
        mask[2] = False  # a row that sees no key
    out, lse = single_prefill_with_kv_cache(q, to_layout(k, layout), to_layout(v, layout),
                                            kv_layout=layout, custom_mask=mask, return_lse=True,
                                            **cfg)
    mode = cfg.get("pos_encoding_mode", "NONE")
    rope = (cfg.get("rope_scale", 1.0), cfg.get("rope_theta", 1e4)) if mode == "ROPE_LLAMA" else None
    exp_out, exp_lse = naive_attention(q, k, v, causal=cfg.get("causal", False),
                                       window_left=cfg.get("window_left", -1),
                                       cap=cfg.get("logits_soft_cap", 0.0), alibi=mode == "ALIBI",
                                       rope=rope, mask=mask, sm_scale=cfg.get("sm_scale"))
    assert out.shape == (qo_len, hq, head_dim_vo) and out.dtype == torch.float32
    assert not torch.isnan(out).any()
    assert rel_error(out, exp_out) <= TOLERANCE[torch.float32]
    assert_lse_close(lse, exp_lse)


def test_rows_without_keys_give_zero_and_neg_inf():
    torch.manual_seed(3)
    q, k, v = rand(9, 2, 8), rand(4, 2, 8), rand(4, 2, 8)
    out, lse = single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out[:5], torch.zeros_like(out[:5]))  # rows 0..4 sit before every key
    assert torch.isneginf(lse[:5]).all() and torch.isfinite(lse[5:]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    torch.manual_seed(4)
    q, k, v = rand(5, 8, 32, dtype=dtype), rand(20, 2, 32, dtype=dtype), rand(20, 2, 32, dtype=dtype)
    out, lse = single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    exp_out, exp_lse = naive_attention(q, k, v, causal=True)
    assert out.dtype == dtype and rel_error(out, exp_out) <= TOLERANCE[dtype]
    assert_lse_close(lse, exp_lse)


def test_kv_dtype_and_o_dtype_may_differ():
    torch.manual_seed(5)
    q, k, v = rand(4, 4, 16, dtype=torch.float16), rand(10, 4, 16), rand(10, 4, 16)
    out = single_prefill_with_kv_cache(q, k, v, o_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert rel_error(out, naive_attention(q, k, v)[0]) <= TOLERANCE[torch.float32]
    assert single_prefill_with_kv_cache(q, k, v, o_dtype="bfloat16").dtype == torch.bfloat16


def test_strided_inputs():
    torch.manual_seed(6)
    qb, kb, vb = rand(6, 4, 40), rand(12, 2, 2, 24), rand(2, 12, 2, 20)
    q, k, v = qb[:, :, 4:20], kb[:, :, 1, :16], vb[1, :, :, 2:18]
    out, lse = single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    exp_out, exp_lse = naive_attention(q, k, v, causal=True)
    assert rel_error(out, exp_out) <= TOLERANCE[torch.float32]
    assert_lse_close(lse, exp_lse)


def test_chunked_rows_match(monkeypatch):
    torch.manual_seed(7)
    q, k, v = rand(10, 4, 16), rand(15, 2, 16), rand(15, 2, 16)
    kw = dict(causal=True, window_left=5, pos_encoding_mode="ALIBI", return_lse=True)
    whole = single_prefill_with_kv_cache(q, k, v, **kw)
    monkeypatch.setattr(ref_attention, "CHUNK_ELEMENTS", 4 * 15 * 3)  # 3 rows per chunk
    chunked = single_prefill_with_kv_cache(q, k, v, **kw)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)


def test_packed_mask_equals_bool_mask_and_wins():
    torch.manual_seed(8)
    q, k, v = rand(5, 2, 8), rand(11, 2, 8), rand(11, 2, 8)
    mask = torch.rand(5, 11) > 0.5
    bits = torch.nn.functional.pad(mask.reshape(-1), (0, 7 * 8 - 55)).reshape(-1, 8).to(torch.uint8)
    packed = (bits << torch.arange(8, dtype=torch.uint8)).sum(-1).to(torch.uint8)  # little-endian
    expected = single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    got = single_prefill_with_kv_cache(q, k, v, packed_custom_mask=packed,
                                       custom_mask=torch.ones(5, 11, dtype=torch.bool))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert rel_error(got, naive_attention(q, k, v, mask=mask)[0]) <= TOLERANCE[torch.float32]


def test_custom_mask_overrides_causal():
    torch.manual_seed(9)
    q, k, v = rand(4, 2, 8), rand(6, 2, 8), rand(6, 2, 8)
    mask = torch.ones(4, 6, dtype=torch.bool)
    with_causal = single_prefill_with_kv_cache(q, k, v, custom_mask=mask, causal=True)
    torch.testing.assert_close(with_causal, single_prefill_with_kv_cache(q, k, v))


def test_scales():
    torch.manual_seed(10)
    q, k, v = rand(3, 2, 16), rand(9, 2, 16), rand(9, 2, 16)
    out = single_prefill_with_kv_cache(q, k, v, sm_scale=0.5, k_scale=0.8, v_scale=1.5)
    assert rel_error(out, 1.5 * naive_attention(q, k, v, sm_scale=0.4)[0]) <= TOLERANCE[torch.float32]
    qd = q[0]
    got = single_decode_with_kv_cache(qd, k, v, q_scale=2.0, k_scale=0.25, v_scale=3.0)
    exp = 3.0 * naive_attention(qd[None], k, v, sm_scale=0.5 / 4.0)[0][0]
    assert rel_error(got, exp) <= TOLERANCE[torch.float32]


def test_return_lse_partial():
    torch.manual_seed(11)
    q, k, v = rand(4, 2, 8), rand(7, 1, 8), rand(7, 1, 8)
    assert isinstance(single_prefill_with_kv_cache_return_lse, functools.partial)
    out, lse = single_prefill_with_kv_cache_return_lse(q, k, v, causal=True)
    assert torch.equal(out, single_prefill_with_kv_cache(q, k, v, causal=True))
    assert lse.shape == (4, 2) and lse.dtype == torch.float32


# --- decode --------------------------------------------------------------------------------

DECODE_CASES = {
    "plain": dict(),
    "window": dict(window_left=5),
    "soft_cap": dict(logits_soft_cap=1.5),
    "alibi": dict(pos_encoding_mode="ALIBI"),
    "rope_llama": dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=1e3),
}


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_decode_reference_vs_float64_and_prefill(case, layout):
    torch.manual_seed(12)
    cfg = DECODE_CASES[case]
    q, k, v = rand(8, 16), rand(21, 2, 16), rand(21, 2, 16)
    kl, vl = to_layout(k, layout), to_layout(v, layout)
    out, lse = single_decode_with_kv_cache(q, kl, vl, kv_layout=layout, return_lse=True, **cfg)
    assert out.shape == (8, 16) and lse.shape == (8,)
    mode = cfg.get("pos_encoding_mode", "NONE")
    exp_out, exp_lse = naive_attention(
        q[None], k, v, window_left=cfg.get("window_left", -1), cap=cfg.get("logits_soft_cap", 0.0),
        alibi=mode == "ALIBI", rope=(1.0, cfg.get("rope_theta", 1e4)) if mode == "ROPE_LLAMA" else None)
    assert rel_error(out, exp_out[0]) <= TOLERANCE[torch.float32]
    assert_lse_close(lse, exp_lse[0])
    p_out, p_lse = single_prefill_with_kv_cache(q[None], kl, vl, kv_layout=layout, causal=True,
                                                return_lse=True, **cfg)
    torch.testing.assert_close(out, p_out[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, p_lse[0], rtol=1e-6, atol=1e-6)


def test_decode_lse_is_base2_and_alibi_uses_key_index():
    torch.manual_seed(13)
    q, k, v = rand(2, 8), rand(6, 2, 8), rand(6, 2, 8)
    _, lse = single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ALIBI", return_lse=True)
    s = torch.einsum("hd,jhd->hj", q.double(), k.double()) / math.sqrt(8)
    s = s + naive_slopes(2)[:, None] * torch.arange(6, dtype=torch.float64)[None, :]
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1) / math.log(2.0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_half_precision(dtype):
    torch.manual_seed(14)
    q, k, v = rand(16, 64, dtype=dtype), rand(100, 4, 64, dtype=dtype), rand(100, 4, 64, dtype=dtype)
    out = single_decode_with_kv_cache(q, k, v)
    assert out.dtype == dtype
    assert rel_error(out, naive_attention(q[None], k, v)[0][0]) <= TOLERANCE[dtype]


# --- ALiBi slopes --------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 8, 12, 32, 40])
def test_alibi_slopes(n):
    slopes = get_alibi_slopes(n)
    assert slopes.dtype == torch.float32 and slopes.shape == (n,)
    torch.testing.assert_close(slopes.double(), naive_slopes(n), rtol=1e-7, atol=0)


def test_alibi_slopes_known_values():
    torch.testing.assert_close(get_alibi_slopes(8), 2.0 ** -torch.arange(1.0, 9.0))
    extra = get_alibi_slopes(12)[8:]
    torch.testing.assert_close(extra, 2.0 ** -torch.tensor([0.5, 1.5, 2.5, 3.5]))
    with pytest.raises(ValueError, match="n_heads"):
        get_alibi_slopes(0)
