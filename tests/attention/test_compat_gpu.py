"""The upstream-compatibility paths of the attention entry points on CUDA, each against the
reference backend on the same inputs: ROPE_LLAMA and ALiBi in the batch wrappers and the single
ops, fp8 KV with tensor calibration scales (per tensor, per KV head), and the block-table
calling conventions (trtllm / xqa / cuDNN) and fast_decode_plan on GPU kernels."""

from __future__ import annotations

import pytest
import torch

from attention_helpers import make_paged
from conftest import rel_error
import flashinfer

pytestmark = pytest.mark.gpu
DEV, BF16, FP8, I32 = "cuda", torch.bfloat16, torch.float8_e4m3fn, torch.int32
HQ, HK, D, PS = 32, 8, 128, 16
KV_LENS, QO_LENS = [1, 37, 300, 1024], [1, 20, 64, 5]


def _ws():
    return torch.empty(128 << 20, dtype=torch.uint8, device=DEV)


def _indptr(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=I32, device=DEV)


def _paged(layout, kv_dtype=BF16):
    torch.manual_seed(0)
    cache, indptr, indices, last, _, _ = make_paged(KV_LENS, PS, HK, D, layout)
    return cache.to(DEV).to(kv_dtype), indptr.to(DEV), indices.to(DEV), last.to(DEV)


def _wrappers(kind, layout, backend, plan_kw, kv_dtype=BF16):
    """(wrapper, query, kv arguments) of one batch wrapper kind, planned with ``plan_kw``."""
    cache, indptr, indices, last = _paged(layout, kv_dtype)
    torch.manual_seed(1)
    kw = dict(q_data_type=BF16, kv_data_type=kv_dtype, **plan_kw)
    if kind == "decode":
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), layout, backend=backend)
        w.plan(indptr, indices, last, HQ, HK, D, PS, **kw)
        return w, torch.randn(len(KV_LENS), HQ, D, device=DEV, dtype=BF16), (cache,)
    qo_indptr = _indptr(QO_LENS)
    q = torch.randn(int(qo_indptr[-1]), HQ, D, device=DEV, dtype=BF16)
    if kind == "paged":
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), layout, backend=backend)
        w.plan(qo_indptr, indptr, indices, last, HQ, HK, D, PS, causal=True, **kw)
        return w, q, (cache,)
    kv_indptr = _indptr(KV_LENS)
    k = torch.randn(int(kv_indptr[-1]), HK, D, device=DEV, dtype=BF16)
    v = torch.randn(int(kv_indptr[-1]), HK, D, device=DEV, dtype=BF16)
    if layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(), layout, backend=backend)
    w.plan(qo_indptr, kv_indptr, HQ, HK, D, causal=True, **kw)
    return w, q, (k, v)


def _close(got, want, out_tol=2e-2, lse_tol=1e-3):
    (o, lse), (eo, el) = got, want
    torch.cuda.synchronize()
    assert rel_error(o, eo) < out_tol
    assert rel_error(lse, el) < lse_tol


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kind", ["decode", "paged", "ragged"])
@pytest.mark.parametrize("rope", [{}, {"rope_scale": 2.0, "rope_theta": 5e5}])
def test_batch_rope_llama_runs_on_a_gpu_kernel(kind, layout, rope):
    """ROPE_LLAMA on a kernel that does not rotate: q and k are rotated first (batch_rope.py)."""
    plan_kw = dict(pos_encoding_mode="ROPE_LLAMA", **rope)
    w, q, kv = _wrappers(kind, layout, "auto", plan_kw)
    assert w.decision.backend != "reference", w.decision.explain()
    ref, _, _ = _wrappers(kind, layout, "reference", plan_kw)
    _close(w.run(q, *kv, return_lse=True), ref.run(q, *kv, return_lse=True))


@pytest.mark.parametrize("kind", ["decode", "paged", "ragged"])
def test_batch_alibi_on_cuda_matches_the_reference(kind):
    w, q, kv = _wrappers(kind, "NHD", "auto", dict(pos_encoding_mode="ALIBI"))
    assert w.decision.backend == "triton", w.decision.explain()  # the split-K kernel adds the bias
    ref, _, _ = _wrappers(kind, "NHD", "reference", dict(pos_encoding_mode="ALIBI"))
    _close(w.run(q, *kv, return_lse=True), ref.run(q, *kv, return_lse=True))


@pytest.mark.parametrize("kind", ["decode", "paged"])
@pytest.mark.parametrize("scales", ["float", "one_element", "per_kv_head"])
def test_fp8_kv_with_calibration_scales(kind, scales):
    torch.manual_seed(2)
    if scales == "float":
        k_scale, v_scale = 0.7, 1.3
    elif scales == "one_element":
        k_scale, v_scale = torch.tensor([0.7], device=DEV), torch.tensor(1.3, device=DEV)
    else:
        k_scale = torch.rand(HK, device=DEV) + 0.5
        v_scale = torch.rand(HK, device=DEV) + 0.5
    w, q, kv = _wrappers(kind, "NHD", "auto", {}, FP8)
    assert w.decision.backend != "reference", w.decision.explain()
    ref, _, _ = _wrappers(kind, "NHD", "reference", {}, FP8)
    got = w.run(q, *kv, return_lse=True, k_scale=k_scale, v_scale=v_scale)
    _close(got, ref.run(q, *kv, return_lse=True, k_scale=k_scale, v_scale=v_scale))


@pytest.mark.parametrize("op", ["decode", "prefill"])
@pytest.mark.parametrize("mode", ["ROPE_LLAMA", "ALIBI"])
def test_single_ops_positional_encodings_on_cuda(op, mode):
    torch.manual_seed(3)
    n_kv, n_q = 700, 1 if op == "decode" else 50
    q = torch.randn(n_q, HQ, D, device=DEV, dtype=BF16)
    k = torch.randn(n_kv, HK, D, device=DEV, dtype=BF16)
    v = torch.randn(n_kv, HK, D, device=DEV, dtype=BF16)
    kw = dict(pos_encoding_mode=mode, rope_theta=5e5) if mode == "ROPE_LLAMA" else dict(
        pos_encoding_mode=mode)
    if op == "decode":
        got = flashinfer.single_decode_with_kv_cache(q[0], k, v, **kw)
        want = flashinfer.single_decode_with_kv_cache(q[0], k, v, backend="reference", **kw)
    else:
        got = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, **kw)
        want = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, backend="reference",
                                                       **kw)
    torch.cuda.synchronize()
    assert rel_error(got, want) < 2e-2


def _block_table(indptr, indices, max_pages):
    batch = indptr.shape[0] - 1
    table = torch.full((batch, max_pages), -3, dtype=I32)
    ip, ids = indptr.cpu(), indices.cpu()
    for b in range(batch):
        row = ids[ip[b]:ip[b + 1]]
        table[b, :row.shape[0]] = row
    return table.to(DEV)


def test_block_table_conventions_on_gpu_kernels():
    cache, indptr, indices, last = _paged("HND")
    table = _block_table(indptr, indices, 64)
    seq_lens = torch.tensor(KV_LENS, dtype=I32, device=DEV)
    torch.manual_seed(4)
    q = torch.randn(len(KV_LENS), HQ, D, device=DEV, dtype=BF16)
    want = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "HND", backend="reference")
    want.plan(indptr, indices, last, HQ, HK, D, PS, q_data_type=BF16, sm_scale=0.1)
    expected, expected_lse = want.run(q, cache, return_lse=True)
    got, got_lse = flashinfer.decode.trtllm_batch_decode_with_kv_cache(
        q, cache, _ws(), table, seq_lens, max(KV_LENS), bmm1_scale=0.1, bmm2_scale=1.0,
        return_lse=True)
    assert rel_error(got, expected) < 2e-2
    assert rel_error(got_lse, expected_lse) < 1e-3  # base 2, [tokens, H_qo], as the wrapper's
    got = flashinfer.decode.xqa_batch_decode_with_kv_cache(
        q, cache, _ws(), table, seq_lens, max(KV_LENS), bmm1_scale=0.1, bmm2_scale=1.0,
        kv_layout="HND")  # xqa's default layout is NHD
    assert rel_error(got, expected) < 2e-2
    k_cache, v_cache = cache.unbind(1)
    o, lse = flashinfer.cudnn_batch_decode_with_kv_cache(
        q, k_cache, v_cache, 0.1, _ws(), max_sequence_kv=max(KV_LENS),
        actual_seq_lens_kv=seq_lens.view(-1, 1, 1, 1), block_tables=table, return_lse=True)
    torch.cuda.synchronize()
    assert rel_error(o, expected) < 2e-2
    assert rel_error(lse, expected_lse * 0.6931471805599453) < 1e-3
    qo_indptr = _indptr(QO_LENS)
    qp = torch.randn(int(qo_indptr[-1]), HQ, D, device=DEV, dtype=BF16)
    ref = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), "HND", backend="reference")
    ref.plan(qo_indptr, indptr, indices, last, HQ, HK, D, PS, causal=True, sm_scale=0.1,
             q_data_type=BF16)
    got, got_lse = flashinfer.prefill.trtllm_batch_context_with_kv_cache(
        qp, cache, _ws(), table, seq_lens, max(QO_LENS), max(KV_LENS), 0.1, 1.0, len(KV_LENS),
        qo_indptr, None, return_lse=True)
    want, want_lse = ref.run(qp, cache, return_lse=True)
    assert rel_error(got, want) < 2e-2 and rel_error(got_lse, want_lse) < 1e-3


def test_fast_decode_plan_on_cuda_equals_plan():
    cache, indptr, indices, last = _paged("NHD")
    torch.manual_seed(5)
    q = torch.randn(len(KV_LENS), HQ, D, device=DEV, dtype=BF16)
    planned = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD")
    planned.plan(indptr, indices, last, HQ, HK, D, PS, q_data_type=BF16)
    fast = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD")
    fast.plan(indptr, indices, last, HQ, HK, D, PS, q_data_type=BF16)
    flashinfer.decode.fast_decode_plan(fast, indptr, indices, last, HQ, HK, D, PS,
                                       q_data_type=BF16)
    torch.testing.assert_close(fast.run(q, cache), planned.run(q, cache), rtol=0, atol=0)


@pytest.mark.parametrize("fused", [False, True])
def test_rmsnorm_quant_on_cuda_matches_the_cpu_reference(fused):
    torch.manual_seed(6)
    x = torch.randn(37, 4096, device=DEV, dtype=BF16)
    w = torch.randn(4096, device=DEV, dtype=BF16)
    out = torch.empty(37, 4096, device=DEV, dtype=FP8)
    want = torch.empty(37, 4096, dtype=FP8)
    if fused:
        r = torch.randn(37, 4096, device=DEV, dtype=BF16)
        r_cpu = r.cpu().clone()
        flashinfer.fused_add_rmsnorm_quant(out, x, r, w, 0.05)
        flashinfer.fused_add_rmsnorm_quant(want, x.cpu(), r_cpu, w.cpu(), 0.05, backend="reference")
        assert torch.equal(r.cpu(), r_cpu)
    else:
        flashinfer.rmsnorm_quant(out, x, w, torch.tensor([0.05], device=DEV))
        flashinfer.rmsnorm_quant(want, x.cpu(), w.cpu(), 0.05, backend="reference")
    got, exp = out.cpu().float(), want.float()
    assert rel_error(got, exp) < 2e-2  # a one-ulp fp8 rounding difference on a few elements


def test_top_k_on_cuda():
    torch.manual_seed(7)
    x = torch.randn(4, 128256, device=DEV)
    values, indices = flashinfer.top_k(x, 50)
    want_v, _ = torch.topk(x, 50, dim=-1)
    torch.testing.assert_close(values.sort(-1, descending=True).values, want_v)
    assert torch.equal(x.gather(-1, indices.long()), values)


@pytest.mark.parametrize("op", ["single", "ragged", "paged"])
def test_head_dim_192_128_runs_on_a_gpu_kernel(op):
    """DeepSeek's prefill shape: q / k head dim 192, v head dim 128 (FA3 serves it on SM 9.0)."""
    torch.manual_seed(8)
    qo_lens, kv_lens = [37, 100], [300, 100]
    q = torch.randn(sum(qo_lens), HQ, 192, device=DEV, dtype=BF16)
    k = torch.randn(sum(kv_lens), HK, 192, device=DEV, dtype=BF16)
    v = torch.randn(sum(kv_lens), HK, 128, device=DEV, dtype=BF16)
    if op == "single":
        with flashinfer.record_decisions() as log:
            got = flashinfer.single_prefill_with_kv_cache(q[:37], k[:300], v[:300], causal=True)
        assert log[-1].backend != "reference", log[-1].explain()
        want = flashinfer.single_prefill_with_kv_cache(q[:37], k[:300], v[:300], causal=True,
                                                       backend="reference")
        torch.cuda.synchronize()
        assert got.shape == (37, HQ, 128) and rel_error(got, want) < 2e-2
        return
    runs = []
    if op == "paged":  # each request's K / V rows from a page boundary, its last page padded
        pages = [-(-n // PS) for n in kv_lens]

        def paged(x):
            pad = [p * PS - n for p, n in zip(pages, kv_lens)]
            rows = torch.cat([x[:300], x[:pad[0]], x[300:], x[:pad[1]]])
            return rows.view(-1, PS, HK, x.shape[-1])

        k_cache, v_cache = paged(k), paged(v)
        indices = torch.arange(sum(pages), dtype=I32, device=DEV)
        last = torch.tensor([n - (p - 1) * PS for n, p in zip(kv_lens, pages)], dtype=I32,
                            device=DEV)
        for backend in ("auto", "reference"):
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), "NHD", backend=backend)
            w.plan(_indptr(qo_lens), _indptr(pages), indices, last, HQ, HK, 192, PS,
                   head_dim_vo=128, causal=True, q_data_type=BF16)
            runs.append((w.decision, w.run(q, (k_cache, v_cache), return_lse=True)))
        assert runs[0][0].backend != "reference", runs[0][0].explain()
        _close(runs[0][1], runs[1][1])
        return
    for backend in ("auto", "reference"):
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(), "NHD", backend=backend)
        w.plan(_indptr(qo_lens), _indptr(kv_lens), HQ, HK, 192, head_dim_vo=128, causal=True,
               q_data_type=BF16)
        runs.append((w.decision, w.run(q, k, v, return_lse=True)))
    assert runs[0][0].backend != "reference", runs[0][0].explain()
    _close(runs[0][1], runs[1][1])


@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_single_ops_with_fp8_kv_and_per_head_scales(op):
    torch.manual_seed(9)
    q = torch.randn(1 if op == "decode" else 50, HQ, D, device=DEV, dtype=BF16)
    k = torch.randn(700, HK, D, device=DEV).to(FP8)
    v = torch.randn(700, HK, D, device=DEV).to(FP8)
    ks, vs = torch.rand(HK, device=DEV) + 0.5, torch.rand(HK, device=DEV) + 0.5
    if op == "decode":
        got = flashinfer.single_decode_with_kv_cache(q[0], k, v, k_scale=ks, v_scale=vs)
        want = flashinfer.single_decode_with_kv_cache(q[0], k, v, k_scale=ks, v_scale=vs,
                                                      backend="reference")
    else:
        got = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, k_scale=ks, v_scale=vs)
        want = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, k_scale=ks,
                                                       v_scale=vs, backend="reference")
    torch.cuda.synchronize()
    assert rel_error(got, want) < 2e-2


@pytest.mark.parametrize("kind", ["decode", "paged"])
def test_fp8_queries_with_fp8_pages_on_a_gpu_kernel(kind):
    """q_data_type e4m3 with a bf16 o_data_type over fp8 pages: run() widens q exactly, so a GPU
    kernel gives what the reference gives on the same fp8 inputs."""
    cache, indptr, indices, last = _paged("NHD", FP8)
    torch.manual_seed(11)
    args = dict(q_scale=0.5, k_scale=1.5, v_scale=0.8, return_lse=True)
    qo_indptr = _indptr(QO_LENS)
    rows = len(KV_LENS) if kind == "decode" else int(qo_indptr[-1])
    q = torch.randn(rows, HQ, D, device=DEV).to(FP8)
    runs = []
    for backend in ("auto", "reference"):
        kw = dict(q_data_type=FP8, kv_data_type=FP8, o_data_type=BF16)
        if kind == "decode":
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", backend=backend)
            w.plan(indptr, indices, last, HQ, HK, D, PS, **kw)
        else:
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), "NHD", backend=backend)
            w.plan(qo_indptr, indptr, indices, last, HQ, HK, D, PS, causal=True, **kw)
        runs.append((w.decision, w.run(q, cache, **args)))
    assert runs[0][0].backend != "reference", runs[0][0].explain()
    assert runs[0][1][0].dtype == BF16
    _close(runs[0][1], runs[1][1])
