"""rope_quantize_fp8 / mla_rope_quantize_fp8 (flashinfer.rope): RoPE from a cos/sin cache on the
rotary parts, then fp8(x * scale) of all four parts, against float64 RoPE; saturation, the MLA
form, given outputs and the refusals."""

from __future__ import annotations

import pytest
import torch

from conftest import rel_error, rope_oracle
from flashinfer import rope

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _cache(rotary_dim, max_pos=256, theta=1e4):
    f = theta ** (-torch.arange(rotary_dim // 2, dtype=torch.float64) * 2 / rotary_dim)
    angle = torch.arange(max_pos, dtype=torch.float64)[:, None] * f
    return torch.cat([angle.cos(), angle.sin()], 1).float()


def _inputs(nnz=7, hq=4, hk=2, rope_dim=32, nope_dim=48, dtype=torch.bfloat16, mla=False):
    torch.manual_seed(0)
    q = torch.randn(nnz, hq, rope_dim, dtype=dtype)
    qn = torch.randn(nnz, hq, nope_dim, dtype=dtype)
    k = torch.randn(nnz, rope_dim, dtype=dtype) if mla else torch.randn(nnz, hk, rope_dim, dtype=dtype)
    kn = torch.randn(nnz, nope_dim, dtype=dtype) if mla else torch.randn(nnz, hk, nope_dim, dtype=dtype)
    pos = torch.tensor([0, 5, 17, 255, 3, 100, 64][:nnz])
    return q, k, qn, kn, pos


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_matches_float64_rope_then_the_scaled_cast(is_neox, dtype):
    q, k, qn, kn, pos = _inputs()
    qr, kr, qno, kno = rope.rope_quantize_fp8(q, k, qn, kn, _cache(32), pos, is_neox, dtype,
                                              quant_scale_q=3.0, quant_scale_kv=0.25)
    assert all(t.dtype == dtype for t in (qr, kr, qno, kno))
    want_q = rope_oracle(q, pos, 32, not is_neox) * 3.0
    want_k = rope_oracle(k, pos, 32, not is_neox) * 0.25
    ulp = 2.0 ** -3 if dtype == E4M3 else 2.0 ** -2  # one fp8 rounding, relative
    assert rel_error(qr.float(), want_q) < ulp / 2 and rel_error(kr.float(), want_k) < ulp / 2
    # the parts without RoPE: exactly the float32 product, cast once
    assert torch.equal(qno, (qn.float() * 3.0).to(dtype))
    assert torch.equal(kno, (kn.float() * 0.25).to(dtype))


def test_the_cast_saturates_and_keeps_nan():
    q, k, qn, kn, pos = _inputs()
    qn[0, 0, 0] = float("nan")
    _, _, qno, _ = rope.rope_quantize_fp8(q, k, qn, kn, _cache(32), pos, quant_scale_q=1e6)
    values = qno.float()
    finite = values[~torch.isnan(values)]
    assert finite.abs().max().item() == 448.0 and torch.isnan(values[0, 0, 0])
    assert not torch.isinf(values).any() and torch.isnan(values).sum() == 1
    _, _, e5, _ = rope.rope_quantize_fp8(q, k, qn, kn, _cache(32), pos, quantize_dtype=E5M2,
                                         quant_scale_q=1e9)
    e5 = e5.float()
    assert e5[~torch.isnan(e5)].abs().max().item() == 57344.0


def test_mla_form_given_outputs_and_missing_nope_parts():
    q, k, qn, kn, pos = _inputs(mla=True)
    outs = [torch.empty(q.shape, dtype=E5M2), torch.empty(k.shape, dtype=E5M2)]
    qr, kr, qno, kno = rope.mla_rope_quantize_fp8(q, k, None, kn, _cache(32), pos,
                                                  q_rope_out=outs[0], k_rope_out=outs[1])
    assert qr is outs[0] and kr is outs[1] and kr.shape == (7, 32)  # dtype from the outputs
    assert qno.shape == (7, 4, 0) and qno.dtype == E5M2 and kno.shape == (7, 48)
    want_k = rope_oracle(k[:, None], pos, 32, False)[:, 0]
    assert rel_error(kr.float(), want_k) < 2.0 ** -3


@pytest.mark.parametrize("change, exc, words", [
    (dict(cos_sin_cache=_cache(16)), ValueError, "rope_dim=32"),
    (dict(quantize_dtype=torch.bfloat16), ValueError, "quantize_dtype"),
    (dict(q_rope_out=torch.empty(7, 4, 32, dtype=E4M3), quantize_dtype=E5M2), ValueError, "q_rope_out"),
    (dict(q_nope=torch.randn(6, 4, 48, dtype=torch.bfloat16)), ValueError, "q_nope"),
    (dict(quant_scale_q=float("inf")), ValueError, "quant_scale_q"),
    (dict(pos_ids=torch.tensor([0, 1, 2, 3, 4, 5, 256])), ValueError, "pos_ids"),
])
def test_refusals(change, exc, words):
    q, k, qn, kn, pos = _inputs()
    args = dict(q_rope=q, k_rope=k, q_nope=qn, k_nope=kn, cos_sin_cache=_cache(32), pos_ids=pos)
    args.update(change)
    with pytest.raises(exc, match=words):
        rope.rope_quantize_fp8(**args)


def _append_layout(kv_lens, page_size):
    """kv_indptr / shuffled kv_indices of requests of ``kv_lens`` keys, every key appended."""
    pages = [-(-n // page_size) for n in kv_lens]
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    indices = torch.randperm(int(indptr[-1]) + 2)[:int(indptr[-1])].to(torch.int32)
    batch = torch.cat([torch.full((n,), b, dtype=torch.int32) for b, n in enumerate(kv_lens)])
    positions = torch.cat([torch.arange(n, dtype=torch.int32) for n in kv_lens])
    return indptr, indices, batch, positions


def _slots(cache, indices, indptr, batch, positions, page_size, layout="NHD"):
    pages = indices[indptr[batch.long()].long() + positions.long() // page_size].long()
    slot = positions.long() % page_size
    return cache[pages, slot] if layout == "NHD" else cache[pages, :, slot]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_form_writes_the_quantised_keys_and_values_into_their_pages(layout):
    q, k, qn, kn, pos = _inputs(nnz=7)
    torch.manual_seed(1)
    v = torch.randn(7, 2, 80, dtype=torch.bfloat16)
    indptr, indices, batch, positions = _append_layout([3, 4], 4)
    shape = (indices.max() + 3, 4, 2, 80) if layout == "NHD" else (indices.max() + 3, 2, 4, 80)
    k_cache = (torch.randn(shape) * 10).to(E4M3)
    v_cache = (torch.randn(shape) * 10).to(E4M3)
    before_k = k_cache.clone()
    qr, qno = rope.rope_quantize_fp8_append_paged_kv_cache(
        q, k, qn, kn, v, _cache(32), pos, (k_cache, v_cache), indices, indptr, batch, positions,
        quant_scale_q=2.0, quant_scale_kv=0.5, page_size=4, kv_layout=layout)
    wq, wk, wqn, wkn = rope.rope_quantize_fp8(q, k, qn, kn, _cache(32), pos, quant_scale_q=2.0,
                                              quant_scale_kv=0.5)
    assert torch.equal(qr.view(torch.uint8), wq.view(torch.uint8))
    assert torch.equal(qno.view(torch.uint8), wqn.view(torch.uint8))
    got_k = _slots(k_cache, indices, indptr, batch, positions, 4, layout)
    want_k = torch.cat([wk.view(torch.uint8), wkn.view(torch.uint8)], -1)
    assert torch.equal(got_k.view(torch.uint8), want_k)
    got_v = _slots(v_cache, indices, indptr, batch, positions, 4, layout)
    assert torch.equal(got_v.view(torch.uint8), (v.float() * 0.5).to(E4M3).view(torch.uint8))
    spare = sorted(set(range(k_cache.shape[0])) - set(indices.tolist()))
    assert torch.equal(k_cache[spare].view(torch.uint8), before_k[spare].view(torch.uint8))


def test_append_form_mla():
    q, k, qn, kn, pos = _inputs(nnz=7, mla=True)
    indptr, indices, batch, positions = _append_layout([5, 2], 4)
    ckv = (torch.randn(indices.max() + 2, 4, 48) * 5).to(E4M3)
    kpe = (torch.randn(indices.max() + 2, 4, 32) * 5).to(E4M3)
    rope.rope_quantize_fp8_append_paged_kv_cache(q, k, qn, kn, None, _cache(32), pos, (ckv, kpe),
                                                 indices, indptr, batch, positions, page_size=4)
    _, wk, _, wkn = rope.mla_rope_quantize_fp8(q, k, qn, kn, _cache(32), pos)
    assert torch.equal(_slots(ckv, indices, indptr, batch, positions, 4).view(torch.uint8),
                       wkn.view(torch.uint8))
    assert torch.equal(_slots(kpe, indices, indptr, batch, positions, 4).view(torch.uint8),
                       wk.view(torch.uint8))
    with pytest.raises(ValueError, match="v=None"):
        rope.rope_quantize_fp8_append_paged_kv_cache(q, k, qn, kn, kn, _cache(32), pos,
                                                     (ckv, kpe), indices, indptr, batch,
                                                     positions, page_size=4)
