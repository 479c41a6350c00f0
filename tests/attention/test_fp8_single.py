"""fp8 inputs of the single-request ops (flashinfer.attention.fp8_single): fp8 KV with a bf16
q and float / per-KV-head scales, and upstream's fp8-q prefill path (scale_q, scale_k, scale_v,
o_dtype), against float64 attention on the dequantised values; the refusals."""

from __future__ import annotations

import math

import pytest
import torch

import flashinfer

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def naive(q, k, v, causal, k_heads, v_heads, sm_scale):
    """float64 ``[qo, H, D]``: scores ``q . (k * k_heads) * sm_scale``, output ``* v_heads``."""
    q, k, v = q.double(), k.double() * k_heads[None, :, None], v.double() * v_heads[None, :, None]
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if causal:
        n, m = q.shape[0], k.shape[0]
        s = s.masked_fill(torch.arange(m)[None, :] > torch.arange(n)[:, None] + m - n, -math.inf)
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


def _kv(dtype, seed=0):
    torch.manual_seed(seed)
    return (torch.randn(40, 2, 32) * 2).to(dtype), (torch.randn(40, 2, 32) * 2).to(dtype)


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
@pytest.mark.parametrize("scales", ["float", "per_kv_head"])
def test_fp8_kv_with_a_bf16_query(dtype, scales):
    k, v = _kv(dtype)
    q = torch.randn(9, 4, 32).bfloat16()
    if scales == "float":
        ks, vs, kh, vh = 0.5, 2.0, torch.tensor([0.5, 0.5]), torch.tensor([2.0, 2.0])
    else:
        kh, vh = torch.tensor([0.5, 1.5]), torch.tensor([2.0, 0.25])
        ks, vs = kh, vh
    got = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, k_scale=ks, v_scale=vs)
    want = naive(q, k, v, True, kh.double(), vh.double(), 32 ** -0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)
    got = flashinfer.single_decode_with_kv_cache(q[0], k, v, k_scale=ks, v_scale=vs)
    want = naive(q[:1], k, v, False, kh.double(), vh.double(), 32 ** -0.5)[0]
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)


def test_upstreams_fp8_query_path():
    k, v = _kv(E4M3, 1)
    torch.manual_seed(2)
    q = torch.randn(9, 4, 32).to(E4M3)
    sq, sk, sv = torch.rand(4) + 0.5, torch.rand(2) + 0.5, torch.rand(2) + 0.5
    got = flashinfer.single_prefill_with_kv_cache(q, k, v, scale_q=sq, scale_k=sk, scale_v=sv,
                                                  o_dtype=torch.float16, causal=True)
    want = naive(q.double() * sq.double()[None, :, None], k, v, True, sk.double(), sv.double(),
                 32 ** -0.5)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("kwargs, words", [
    (dict(o_dtype=None), "o_dtype"),
    (dict(k=torch.randn(40, 2, 32).bfloat16()), "both be fp8"),
    (dict(q=torch.randn(9, 4, 32).bfloat16(), scale_q=torch.ones(4)), "dequantisation scales"),
    (dict(scale_q=torch.ones(3)), "scale_q must be"),
])
def test_refusals(kwargs, words):
    k, v = _kv(E4M3)
    args = dict(q=torch.randn(9, 4, 32).to(E4M3), k=k, v=v, o_dtype=torch.bfloat16)
    args.update(kwargs)
    with pytest.raises(ValueError, match=words):
        flashinfer.single_prefill_with_kv_cache(**args)
