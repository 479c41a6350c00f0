"""Fuzz suite, attention: the scalar arguments (a finite softmax scale anywhere in the accepted
range gives a finite result that matches float64 math; a scale outside it, a non-finite soft cap,
RoPE theta or scale raise up front, naming the argument) and the index arrays of the batch
wrappers' plan() (one wrong entry raises naming the argument). GPU versions run every backend
with a record for the op."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

import flashinfer
from flashinfer.attention.params import MAX_SOFTMAX_SCALE
from flashinfer.capability_db import database
from flashinfer.dispatch import BackendUnavailableError, NoBackendError

from conftest import FUZZ, raises_naming

I32 = torch.int32


def naive_attention(q, k, v, scale: float, causal: bool) -> torch.Tensor:
    """float64 softmax attention, NHD ``q [n, H, D]``, ``k/v [m, H_kv, D]`` (bottom-right causal)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("nhd,mhd->hnm", q, k) * scale
    if causal:
        n, m = q.shape[0], k.shape[0]
        hide = torch.arange(m)[None, :] > torch.arange(n)[:, None] + (m - n)
        s = s.masked_fill(hide, -math.inf)
    return torch.einsum("hnm,mhd->nhd", torch.softmax(s, -1), v)


scales = st.one_of(st.floats(1e-30, MAX_SOFTMAX_SCALE), st.just(MAX_SOFTMAX_SCALE))
bad_scales = st.one_of(st.floats(MAX_SOFTMAX_SCALE * 1.0001, 1e308), st.floats(-1e308, 0.0),
                       st.just(math.inf), st.just(-math.inf), st.just(math.nan), st.just(-1e38))


def _inputs(qo: int, kv: int, hq=4, hk=2, d=16, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(qo * 131 + kv)
    q = torch.randn(qo, hq, d, generator=g)
    k = torch.randn(kv, hk, d, generator=g)
    v = torch.randn(kv, hk, d, generator=g)
    return [t.to(dtype).to(device) for t in (q, k, v)]


def _check_against_naive(out, q, k, v, scale, causal):
    """``q, k, v`` as the kernel read them (their dtype sets the tolerance)."""
    want = naive_attention(q.cpu(), k.cpu(), v.cpu(), scale, causal)
    assert torch.isfinite(out).all()
    if abs(scale) <= 10:  # well conditioned: the kernels match float64 math closely
        err = float((out.cpu().double() - want).norm() / want.norm().clamp_min(1e-30))
        assert err < (1e-4 if q.dtype == torch.float32 else 2e-2)
    else:  # a near one-hot softmax: still a convex combination of the values
        lo = v.double().amin(0).amin(0).cpu() - 1e-2
        hi = v.double().amax(0).amax(0).cpu() + 1e-2
        o = out.cpu().double()
        assert bool(((o >= lo) & (o <= hi)).all())


@FUZZ
@given(scale=scales, qo=st.integers(1, 5), kv=st.integers(1, 9), causal=st.booleans())
def test_finite_scale_in_range_gives_finite_result_matching_float64(scale, qo, kv, causal):
    q, k, v = _inputs(qo, kv)
    out = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal and qo <= kv,
                                                  sm_scale=scale)
    _check_against_naive(out, q, k, v, scale, causal and qo <= kv)
    dec = flashinfer.single_decode_with_kv_cache(q[0], k, v, sm_scale=scale)
    _check_against_naive(dec[None], q[:1], k, v, scale, False)


@FUZZ
@given(scale=bad_scales)
def test_scale_outside_the_range_raises_naming_it(scale):
    q, k, v = _inputs(2, 3)
    with raises_naming("sm_scale"):
        flashinfer.single_prefill_with_kv_cache(q, k, v, sm_scale=scale)
    with raises_naming("sm_scale"):
        flashinfer.single_decode_with_kv_cache(q[0], k, v, sm_scale=scale)


@FUZZ
@given(q_scale=st.floats(1.0, 1e6), k_scale=st.floats(1.0, 1e6))
def test_calibration_scales_count_in_the_softmax_scale(q_scale, k_scale):
    q, k, v = _inputs(1, 3)
    effective = q_scale * k_scale / math.sqrt(16)
    if effective <= MAX_SOFTMAX_SCALE:
        out = flashinfer.single_decode_with_kv_cache(q[0], k, v, q_scale=q_scale, k_scale=k_scale)
        assert torch.isfinite(out).all()
    else:
        with raises_naming("sm_scale * q_scale * k_scale"):
            flashinfer.single_decode_with_kv_cache(q[0], k, v, q_scale=q_scale, k_scale=k_scale)


non_finite = st.sampled_from([math.nan, math.inf, -math.inf])


@FUZZ
@given(name=st.sampled_from(["logits_soft_cap", "rope_scale", "rope_theta"]),
       value=st.one_of(non_finite, st.floats(-1e30, -1e-30)))
def test_non_finite_or_negative_scalars_raise_naming_them(name, value):
    q, k, v = _inputs(2, 3)
    with raises_naming(name):
        flashinfer.single_prefill_with_kv_cache(q, k, v, **{name: value})
    with raises_naming(name):
        flashinfer.single_decode_with_kv_cache(q[0], k, v, **{name: value})


# --------------------------------------------------------------------------------------------
# batch wrappers: plan() index arrays and scalars


def _ws(device="cpu"):
    return torch.empty(1 << 20, dtype=torch.uint8, device=device)


@st.composite
def paged_plans(draw):
    page_size = draw(st.sampled_from([1, 4]))
    pages = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    last = [draw(st.integers(1, page_size)) for _ in pages]
    return page_size, indptr, list(range(indptr[-1])), last


DECODE_BAD = ("indptr_start", "indptr_order", "indices_negative", "last_zero", "last_big")


@FUZZ
@given(plan=paged_plans(), kind=st.sampled_from(DECODE_BAD), data=st.data())
def test_decode_plan_with_one_bad_index_raises_naming_it(plan, kind, data):
    page_size, indptr, indices, last = plan
    b = data.draw(st.integers(0, len(last) - 1))
    if kind == "indptr_start":
        indptr[0], word = data.draw(st.integers(1, 5)), "indptr[0]"
    elif kind == "indptr_order":
        indptr[b + 1], word = indptr[b] - data.draw(st.integers(1, 5)), "indptr"
    elif kind == "indices_negative":
        indices[data.draw(st.integers(0, len(indices) - 1))], word = -data.draw(st.integers(1, 99)), "indices"
    elif kind == "last_zero":
        last[b], word = 0, "last_page_len"
    else:
        last[b], word = page_size + data.draw(st.integers(1, 9)), "last_page_len"
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    with raises_naming(word):
        w.plan(torch.tensor(indptr, dtype=I32), torch.tensor(indices, dtype=I32),
               torch.tensor(last, dtype=I32), 2, 2, 16, page_size, q_data_type=torch.float32)


@FUZZ
@given(plan=paged_plans(), extra=st.integers(0, 50))
def test_page_id_past_the_cache_raises_at_run_naming_it(plan, extra):
    page_size, indptr, indices, last = plan
    num_pages = len(indices)
    indices[-1] = num_pages + extra
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
    qo = torch.arange(len(last) + 1, dtype=I32)
    w.plan(qo, torch.tensor(indptr, dtype=I32), torch.tensor(indices, dtype=I32),
           torch.tensor(last, dtype=I32), 2, 2, 16, page_size, q_data_type=torch.float32)
    cache = torch.randn(num_pages, 2, page_size, 2, 16)
    with raises_naming("paged_kv_indices", f"page id {num_pages + extra}", f"[0, {num_pages})"):
        w.run(torch.randn(len(last), 2, 16), cache)


@FUZZ
@given(plan=paged_plans(), kind=st.sampled_from(["start", "order", "short"]), data=st.data())
def test_prefill_plan_with_bad_qo_indptr_raises_naming_it(plan, kind, data):
    page_size, indptr, indices, last = plan
    qo = list(range(len(last) + 1))
    if kind == "start":
        qo[0] = data.draw(st.integers(1, 4))
    elif kind == "order":
        qo[-1] = qo[-2] - data.draw(st.integers(1, 4))
    else:
        qo = qo[:-1] if len(qo) > 2 else qo + [qo[-1] + 1]
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
    with pytest.raises(ValueError, match="qo_indptr|paged_kv_indptr|paged_kv_last_page_len"):
        w.plan(torch.tensor(qo, dtype=I32), torch.tensor(indptr, dtype=I32),
               torch.tensor(indices, dtype=I32), torch.tensor(last, dtype=I32), 2, 2, 16,
               page_size, q_data_type=torch.float32)


@FUZZ
@given(scale=bad_scales, name=st.sampled_from(["sm_scale", "rope_scale", "rope_theta"]))
def test_batch_plan_rejects_bad_scalars(scale, name):
    if name != "sm_scale" and math.isfinite(scale) and scale > 0:
        return  # a large finite RoPE parameter is fine
    indptr, indices, last = (torch.tensor(a, dtype=I32) for a in ([0, 1], [0], [1]))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    with raises_naming(name):
        w.plan(indptr, indices, last, 2, 2, 16, 4, q_data_type=torch.float32, **{name: scale})
    r = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    with raises_naming(name):
        r.plan(indptr, indptr, 2, 2, 16, q_data_type=torch.float32, **{name: scale})


def test_run_time_scales_count_in_the_softmax_scale():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    w.plan(torch.tensor([0, 1], dtype=I32), torch.tensor([0], dtype=I32),
           torch.tensor([2], dtype=I32), 2, 2, 16, 4, q_data_type=torch.float32)
    q, cache = torch.randn(1, 2, 16), torch.randn(1, 2, 4, 2, 16)
    assert torch.isfinite(w.run(q, cache, q_scale=100.0, k_scale=100.0)).all()
    with raises_naming("sm_scale * q_scale * k_scale"):
        w.run(q, cache, q_scale=1e4, k_scale=1e4)


# --------------------------------------------------------------------------------------------
# GPU: every backend with a record for the op, at the edges of the accepted range


def _gpu_kernels(op):
    return [r.backend if r.variant == "default" else f"{r.backend}:{r.variant}"
            for r in database().for_op(op) if "cuda" in r.devices]


EDGE_SCALES = [MAX_SOFTMAX_SCALE, 1e-3, 1e-30]


@pytest.mark.gpu
@pytest.mark.parametrize("scale", EDGE_SCALES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op,backend", [(op, b) for op in ("single_prefill", "single_decode")
                                        for b in _gpu_kernels(op)])
def test_gpu_edge_scales_are_finite_on_every_backend(op, backend, dtype, scale):
    q, k, v = _inputs(64 if op == "single_prefill" else 1, 300, hq=8, hk=2, d=128, dtype=dtype,
                      device="cuda")
    try:
        if op == "single_prefill":
            out = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, sm_scale=scale,
                                                          backend=backend)
        else:
            out = flashinfer.single_decode_with_kv_cache(q[0], k, v, sm_scale=scale,
                                                         backend=backend)[None]
    except (BackendUnavailableError, NoBackendError) as err:
        pytest.skip(f"{backend} rejects this case: {err}")
    torch.cuda.synchronize()
    _check_against_naive(out.float(), q, k, v, scale, op == "single_prefill")


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [MAX_SOFTMAX_SCALE, 1e-3])
@pytest.mark.parametrize("op,backend", [(op, b) for op in ("batch_decode", "batch_prefill_paged",
                                                           "batch_prefill_ragged")
                                        for b in _gpu_kernels(op)])
def test_gpu_batch_edge_scales_are_finite_on_every_backend(op, backend, scale):
    dev, dtype, ps, hq, hk, d = "cuda", torch.bfloat16, 16, 8, 2, 128
    kv_lens, qo_lens = [33, 300, 17], ([1, 1, 1] if op == "batch_decode" else [5, 40, 17])
    g = torch.Generator().manual_seed(7)
    q = torch.randn(sum(qo_lens), hq, d, generator=g).to(dtype).to(dev)
    qo_indptr = torch.tensor([0, 5, 45, 62] if op != "batch_decode" else [0, 1, 2, 3], dtype=I32)
    try:
        if op == "batch_prefill_ragged":
            kv_indptr = torch.tensor([0, 33, 333, 350], dtype=I32)
            k = torch.randn(350, hk, d, generator=g).to(dtype).to(dev)
            v = torch.randn(350, hk, d, generator=g).to(dtype).to(dev)
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(dev), backend=backend)
            w.plan(qo_indptr, kv_indptr, hq, hk, d, causal=True, sm_scale=scale, q_data_type=dtype)
            out = w.run(q, k, v)
        else:
            pages = [-(-n // ps) for n in kv_lens]
            indptr = torch.tensor([0, pages[0], pages[0] + pages[1], sum(pages)], dtype=I32)
            indices = torch.randperm(sum(pages), generator=g).to(I32)
            last = torch.tensor([n - (p - 1) * ps for n, p in zip(kv_lens, pages)], dtype=I32)
            cache = torch.randn(sum(pages), 2, ps, hk, d, generator=g).to(dtype).to(dev)
            if op == "batch_decode":
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(dev), backend=backend)
                w.plan(indptr, indices, last, hq, hk, d, ps, sm_scale=scale, q_data_type=dtype)
            else:
                w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(dev), backend=backend)
                w.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, causal=True,
                       sm_scale=scale, q_data_type=dtype)
            out = w.run(q, cache)
    except (BackendUnavailableError, NoBackendError, NotImplementedError) as err:
        pytest.skip(f"{backend} rejects this case: {err}")
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("op", ["single_prefill", "single_decode"])
def test_large_scales_avoid_fa3_on_sm90(op):
    """FA3 returned NaN rows for one input at sm_scale 1e4 on the H200: its records do not
    declare large_sm_scale, so auto picks another kernel there and an explicit fa3 raises."""
    from flashinfer.device import simulated
    from flashinfer.dispatch import Problem, select

    def problem(*features):
        return Problem.make(op, simulated("9.0"),
                            dtypes={"q": torch.bfloat16, "kv": torch.bfloat16, "o": torch.bfloat16},
                            shape={"head_dim_qk": 128, "head_dim_vo": 128, "num_qo_heads": 32,
                                   "num_kv_heads": 8, "qo_len": 64, "kv_len": 4096},
                            features=("gqa",) + features, layout="NHD")
    fa3 = "flash_attn:fa3"
    small = select(problem(), assume_installed=True)
    large = select(problem("large_sm_scale"), assume_installed=True)
    assert fa3 in [c.name for c in small.candidates if c.usable]
    assert large.name != fa3 and large.name != "reference"
    rejected = {c.name: c.reasons for c in large.candidates if not c.usable}
    assert "large_sm_scale" in str(rejected[fa3])
