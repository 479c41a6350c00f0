"""rope_quantize_fp8 / mla_rope_quantize_fp8 (flashinfer.rope): RoPE from a cos/sin cache on the
rotary parts, then fp8(x * scale) of all four parts, against float64 RoPE; saturation, the MLA
form, given outputs and the refusals; on CUDA (marker ``gpu``), the same calls against the CPU
path, the append form included."""

from __future__ import annotations

import pytest
import torch

from conftest import rel_error, rope_oracle
import flashinfer
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


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_append_form_skips_padding_tokens(backend):
    """A negative batch_indices entry marks a padding token (upstream's rule for this op): it is
    not appended and is no fault; the caches equal those of the real tokens alone, and the plain
    append_paged_kv_cache still refuses such an entry."""
    q, k, qn, kn, _ = _inputs(nnz=10)
    pos = torch.tensor([0, 5, 17, 255, 3, 100, 64, 9, 31, 200])
    v = torch.randn(10, 2, 80, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    indptr, indices, batch, positions = _append_layout([3, 4], 4)
    real = torch.tensor([0, 1, 3, 4, 6, 7, 9])  # tokens 2, 5 and 8 are padding
    padded_batch = torch.full((10,), -1, dtype=torch.int32)
    padded_batch[real] = batch
    padded_pos = torch.full((10,), 12345, dtype=torch.int32)  # never read for padding
    padded_pos[real] = positions
    shape = (indices.max() + 3, 4, 2, 80)
    caches = [(torch.randn(shape) * 10).to(E4M3) for _ in range(2)]
    want = [c.clone() for c in caches]
    kw = dict(quant_scale_kv=0.5, page_size=4, backend=backend)
    rope.rope_quantize_fp8_append_paged_kv_cache(
        q, k, qn, kn, v, _cache(32), pos, tuple(caches), indices, indptr, padded_batch,
        padded_pos, **kw)
    rope.rope_quantize_fp8_append_paged_kv_cache(
        q[real], k[real], qn[real], kn[real], v[real], _cache(32), pos[real], tuple(want), indices,
        indptr, batch, positions, **kw)
    for got, expected in zip(caches, want):
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    with pytest.raises(ValueError, match="batch_indices"):
        flashinfer.append_paged_kv_cache(want[0].new_zeros(10, 2, 80),
                                          want[1].new_zeros(10, 2, 80), padded_batch,
                                          padded_pos, tuple(want), indices, indptr,
                                          torch.ones(2, dtype=torch.int32))


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


# --- GPU: the same calls on CUDA tensors vs their CPU copies (the reference path above) --------

DEV = "cuda"
BF16 = torch.bfloat16


def _poisoned_fp8(shape, dtype=E4M3, device=None):
    """An fp8 buffer of NaN bytes (0x7F is NaN in e4m3fn and in e5m2): an element left
    unwritten stays NaN and fails the comparison."""
    t = torch.empty(shape, dtype=dtype, device=device or DEV)
    t.view(torch.uint8).fill_(0x7F)
    return t


def _fp8_step(x, dtype):
    """The spacing of the fp8 grid of ``dtype`` at magnitude ``x`` (float64): 2^(exponent -
    mantissa bits), the subnormal spacing below the smallest normal."""
    mantissa, min_exp = (3, -6) if dtype == E4M3 else (2, -14)
    return torch.exp2(torch.floor(torch.log2(x.clamp_min(2.0 ** min_exp))) - mantissa)


def _assert_fp8_within_one_step(got, want):
    """``got`` (any device) vs ``want`` (CPU), one fp8 dtype: NaN in the same places, elsewhere at
    most one fp8 step apart (a float32 rounding difference before the cast may cross a rounding
    boundary) and no more than 1% of the elements differing at all."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    g, w = got.cpu().double(), want.double()
    nan = torch.isnan(w)
    assert torch.equal(torch.isnan(g), nan), f"NaN differs at {int((torch.isnan(g) != nan).sum())}"
    g, w = g[~nan], w[~nan]
    diff = (g - w).abs()
    step = _fp8_step(torch.maximum(g.abs(), w.abs()), got.dtype)
    assert bool((diff <= step).all()), f"{int((diff > step).sum())} elements more than a step off"
    assert (diff > 0).double().mean().item() <= 0.01, f"{int((diff > 0).sum())} elements differ"


def _same_bits(got, want):
    return torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))


def _assert_served_on_the_gpu(log, *ops):
    """Each of ``ops`` was decided for the CUDA device and not served by the reference: the triton
    records of rope (float32, cos/sin cache) and append_paged_kv (NHD / HND, any dtype) cover SM
    7.5-12.1 and come first in dispatch_rules/{rope,append_paged_kv}.toml."""
    for op in ops:
        mine = [d for d in log if d.problem.op == op]
        assert mine, f"no {op} decision in {[d.problem.op for d in log]}"
        for d in mine:
            assert d.problem.device == torch.device(DEV).type and d.backend != "reference", \
                d.explain()


def _bf16_parts(nnz, hq, hk, rope_dim, nope_dim, seed, mla=False):
    """Seeded bf16 ``(q_rope, k_rope, q_nope, k_nope)`` on the CPU; ``hk`` None with ``mla``."""
    g = torch.Generator().manual_seed(seed)
    k_lead = (nnz,) if mla else (nnz, hk)
    return tuple(torch.randn(*shape, generator=g).to(BF16) for shape in (
        (nnz, hq, rope_dim), (*k_lead, rope_dim), (nnz, hq, nope_dim), (*k_lead, nope_dim)))


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_gpu_rope_quantize_fp8_matches_the_cpu_path(is_neox, dtype):
    """rope_quantize_fp8 on CUDA vs the CPU reference, into NaN-poisoned outputs."""
    # rotated parts: within one fp8 step; unrotated parts: bit-exact (an exact product, one cast)
    q, k, qn, kn = _bf16_parts(300, 16, 4, 64, 128, seed=10)
    pos = torch.randint(0, 4096, (300,), generator=torch.Generator().manual_seed(11))
    cache = _cache(64, max_pos=4096)
    scales = dict(quant_scale_q=128.0, quant_scale_kv=0.375)  # exact in float32; 128 saturates
    want = rope.rope_quantize_fp8(q, k, qn, kn, cache, pos, is_neox, dtype, **scales,
                                  backend="reference")
    outs = [_poisoned_fp8(t.shape, dtype) for t in (q, k, qn, kn)]
    with flashinfer.record_decisions() as log:
        got = rope.rope_quantize_fp8(
            *(t.to(DEV) for t in (q, k, qn, kn, cache, pos)), is_neox, dtype, **scales,
            q_rope_out=outs[0], k_rope_out=outs[1], q_nope_out=outs[2], k_nope_out=outs[3])
    flashinfer.check_errors()
    assert all(a is b for a, b in zip(got, outs))
    _assert_served_on_the_gpu(log, "rope")
    _assert_fp8_within_one_step(got[0], want[0])
    _assert_fp8_within_one_step(got[1], want[1])
    assert _same_bits(got[2], want[2]) and _same_bits(got[3], want[3])
    if dtype == E4M3:
        assert want[2].float().abs().max().item() == 448.0  # the saturation was exercised


@pytest.mark.gpu
def test_gpu_mla_rope_quantize_fp8_matches_the_cpu_path():
    """mla_rope_quantize_fp8 (DeepSeek's 64 + 512 split, interleaved) on CUDA vs the CPU path."""
    # 2-D k_rope / k_nope; rotated parts within one fp8 step, the rest bit-exact
    q, k, qn, kn = _bf16_parts(200, 16, None, 64, 512, seed=12, mla=True)
    pos = torch.randint(0, 4096, (200,), generator=torch.Generator().manual_seed(13),
                        dtype=torch.int32)
    cache = _cache(64, max_pos=4096)
    scales = dict(quant_scale_q=0.5, quant_scale_kv=2.0)
    want = rope.mla_rope_quantize_fp8(q, k, qn, kn, cache, pos, False, **scales,
                                      backend="reference")
    outs = [_poisoned_fp8(t.shape) for t in (q, k, qn, kn)]
    with flashinfer.record_decisions() as log:
        got = rope.mla_rope_quantize_fp8(
            *(t.to(DEV) for t in (q, k, qn, kn, cache, pos)), False, **scales,
            q_rope_out=outs[0], k_rope_out=outs[1], q_nope_out=outs[2], k_nope_out=outs[3])
    flashinfer.check_errors()
    assert all(a is b for a, b in zip(got, outs)) and got[1].shape == (200, 64)
    _assert_served_on_the_gpu(log, "rope")
    _assert_fp8_within_one_step(got[0], want[0])
    _assert_fp8_within_one_step(got[1], want[1])
    assert _same_bits(got[2], want[2]) and _same_bits(got[3], want[3])


GPU_KV_LENS, GPU_PAGE = [37, 1, 64, 130], 16


def _gpu_append_layout():
    """``(kv_indptr, kv_indices, batch_indices, positions)`` of GPU_KV_LENS, seeded, on the CPU."""
    torch.manual_seed(14)  # _append_layout's page permutation
    return _append_layout(GPU_KV_LENS, GPU_PAGE)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_gpu_append_form_matches_the_cpu_path(layout):
    """rope_quantize_fp8_append_paged_kv_cache (GQA) on CUDA vs the CPU path, caches NaN first."""
    # every slot written on one device is written on the other (NaN elsewhere on both); the keys'
    # rotated half within one fp8 step; their unrotated half, the values, q_nope bit-exact
    indptr, indices, batch, positions = _gpu_append_layout()
    nnz = sum(GPU_KV_LENS)
    q, k, qn, kn = _bf16_parts(nnz, 16, 4, 64, 64, seed=15)
    v = torch.randn(nnz, 4, 128, generator=torch.Generator().manual_seed(16)).to(BF16)
    pages = int(indices.max()) + 3
    shape = (pages, GPU_PAGE, 4, 128) if layout == "NHD" else (pages, 4, GPU_PAGE, 128)
    want_kv = (_poisoned_fp8(shape, device="cpu"), _poisoned_fp8(shape, device="cpu"))
    got_kv = tuple(c.to(DEV) for c in want_kv)
    cache = _cache(64, max_pos=4096)
    kw = dict(quant_scale_q=4.0, quant_scale_kv=0.5, page_size=GPU_PAGE, kv_layout=layout)
    want_q = rope.rope_quantize_fp8_append_paged_kv_cache(
        q, k, qn, kn, v, cache, positions, want_kv, indices, indptr, batch, positions, **kw,
        backend="reference")
    q_outs = [_poisoned_fp8(t.shape) for t in (q, qn)]
    with flashinfer.record_decisions() as log:
        got_q = rope.rope_quantize_fp8_append_paged_kv_cache(
            *(t.to(DEV) for t in (q, k, qn, kn, v, cache, positions)), got_kv,
            *(t.to(DEV) for t in (indices, indptr, batch, positions)), **kw,
            q_rope_out=q_outs[0], q_nope_out=q_outs[1])
    flashinfer.check_errors()
    assert got_q[0] is q_outs[0] and got_q[1] is q_outs[1]
    _assert_served_on_the_gpu(log, "rope", "append_paged_kv")
    _assert_fp8_within_one_step(got_q[0], want_q[0])
    assert _same_bits(got_q[1], want_q[1])
    _assert_fp8_within_one_step(got_kv[0], want_kv[0])  # NaN where no token went, on both
    assert _same_bits(got_kv[0][..., 64:], want_kv[0][..., 64:])
    assert _same_bits(got_kv[1], want_kv[1])
    assert not torch.isnan(want_kv[1].float()).all()  # (the reference did write)


@pytest.mark.gpu
def test_gpu_append_form_mla_matches_the_cpu_path():
    """The MLA append form (ckv / kpe caches) on CUDA vs the CPU path, caches NaN first."""
    # ckv (the unrotated k_nope) bit-exact, kpe (the rotated k_rope) within one fp8 step
    indptr, indices, batch, positions = _gpu_append_layout()
    nnz = sum(GPU_KV_LENS)
    q, k, qn, kn = _bf16_parts(nnz, 16, None, 64, 512, seed=17, mla=True)
    pages = int(indices.max()) + 3
    want_kv = (_poisoned_fp8((pages, GPU_PAGE, 512), device="cpu"),
               _poisoned_fp8((pages, GPU_PAGE, 64), device="cpu"))
    got_kv = tuple(c.to(DEV) for c in want_kv)
    cache = _cache(64, max_pos=4096)
    kw = dict(quant_scale_q=2.0, quant_scale_kv=0.25, page_size=GPU_PAGE)
    want_q = rope.rope_quantize_fp8_append_paged_kv_cache(
        q, k, qn, kn, None, cache, positions, want_kv, indices, indptr, batch, positions, **kw,
        backend="reference")
    with flashinfer.record_decisions() as log:
        got_q = rope.rope_quantize_fp8_append_paged_kv_cache(
            *(t.to(DEV) for t in (q, k, qn, kn)), None, cache.to(DEV), positions.to(DEV), got_kv,
            *(t.to(DEV) for t in (indices, indptr, batch, positions)), **kw)
    flashinfer.check_errors()
    _assert_served_on_the_gpu(log, "rope", "append_paged_kv")
    _assert_fp8_within_one_step(got_q[0], want_q[0])
    assert _same_bits(got_q[1], want_q[1])
    assert _same_bits(got_kv[0], want_kv[0])
    _assert_fp8_within_one_step(got_kv[1], want_kv[1])


@pytest.mark.gpu
def test_gpu_append_form_skips_padding_tokens():
    """Padding tokens (negative batch_indices) on CUDA: no fault recorded, and the caches equal
    the CPU path's with the real tokens alone."""
    indptr, indices, batch, positions = _gpu_append_layout()
    nnz = sum(GPU_KV_LENS)
    q, k, qn, kn = _bf16_parts(nnz + 5, 16, 4, 64, 64, seed=17)
    v = torch.randn(nnz + 5, 4, 128, generator=torch.Generator().manual_seed(18)).to(BF16)
    pos = torch.randint(0, 4096, (nnz + 5,), generator=torch.Generator().manual_seed(19))
    real = torch.randperm(nnz + 5, generator=torch.Generator().manual_seed(20))[:nnz].sort().values
    padded_batch = torch.full((nnz + 5,), -1, dtype=torch.int32)
    padded_batch[real] = batch
    padded_pos = torch.zeros(nnz + 5, dtype=torch.int32)
    padded_pos[real] = positions
    shape = (int(indices.max()) + 3, GPU_PAGE, 4, 128)
    want_kv = (_poisoned_fp8(shape, device="cpu"), _poisoned_fp8(shape, device="cpu"))
    got_kv = tuple(c.to(DEV) for c in want_kv)
    cache = _cache(64, max_pos=4096)
    kw = dict(quant_scale_kv=0.5, page_size=GPU_PAGE)
    rope.rope_quantize_fp8_append_paged_kv_cache(
        q[real], k[real], qn[real], kn[real], v[real], cache, pos[real], want_kv, indices, indptr,
        batch, positions, **kw, backend="reference")
    rope.rope_quantize_fp8_append_paged_kv_cache(
        *(t.to(DEV) for t in (q, k, qn, kn, v, cache, pos)), got_kv,
        *(t.to(DEV) for t in (indices, indptr, padded_batch, padded_pos)), **kw)
    flashinfer.check_errors()  # raises if a padding token was recorded as a bad index
    _assert_fp8_within_one_step(got_kv[0], want_kv[0])
    assert _same_bits(got_kv[1], want_kv[1])
