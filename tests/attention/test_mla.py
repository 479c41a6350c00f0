"""BatchMLAPagedAttentionWrapper (flashinfer.mla): plan() / run() against a float64 naive MLA
computed here from the page table, the lse bases, fp8 caches with their scales, the argument
checks, and the Decision on simulated SMs. The reference backend is the one MLA kernel so far."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import poison, rel_error
import flashinfer
from flashinfer.device import simulated
from flashinfer.dispatch import NoBackendError, Problem, select
from mla_helpers import E4M3, I32, _assert_lse, _case, _plan, _ws, naive

CASES = [
    # qo_lens, kv_lens: decode; MTP (2 per request); ragged prefill with a cached prefix, a
    # request with more queries than keys (causal: its first rows see nothing), one without keys
    ([1, 1, 1, 1], [1, 3, 4, 5]),
    ([2, 2, 2], [7, 8, 9]),
    ([5, 3, 4], [12, 2, 0]),
]


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qo_lens, kv_lens", CASES)
def test_matches_the_naive_mla(page_size, causal, qo_lens, kv_lens):
    arrays, t = _case(qo_lens, kv_lens, page_size=page_size)
    w = _plan(arrays, page_size, causal)
    assert w.decision.backend == "reference"
    out = poison(torch.empty_like(t["q_nope"]))
    got, lse = w.run(**t, out=out, return_lse=True)
    want, want_lse = naive(arrays, t, page_size, causal, 0.17)
    assert got is out and rel_error(got, want) < 1e-5
    _assert_lse(lse, want_lse)


def test_lse_base_e_a_given_buffer_and_no_rope_part():
    arrays, t = _case([2, 3], [9, 4], kpe=0)
    w = _plan(arrays, 4, True, kpe=0)
    lse = torch.full((5, 4), float("nan"))
    out, got = w.run(**t, lse=lse, return_lse=True, return_lse_base_on_e=True)
    _, want = naive(arrays, t, 4, True, 0.17)
    assert got is lse and rel_error(got, want * math.log(2.0)) < 1e-5
    assert isinstance(w.run(**t), torch.Tensor)  # no lse asked: the output alone


def test_views_of_one_latent_buffer():
    """SGLang / vLLM pass ckv and kpe as slices of one [pages, page_size, 576]-like buffer."""
    arrays, t = _case([1, 2], [6, 5])
    joint = torch.cat([t["ckv_cache"], t["kpe_cache"]], -1)
    w = _plan(arrays, 4, True)
    got = w.run(t["q_nope"], t["q_pe"], joint[..., :32], joint[..., 32:])
    assert rel_error(got, naive(arrays, t, 4, True, 0.17)[0]) < 1e-5


def test_half_precision_queries():
    arrays, t = _case([3, 1], [10, 3], seed=4)
    half = {k: v.to(torch.bfloat16) for k, v in t.items()}
    w = _plan(arrays, 4, True, dtype=torch.bfloat16)
    got = w.run(**half)
    assert got.dtype == torch.bfloat16
    want, _ = naive(arrays, {k: v.float() for k, v in half.items()}, 4, True, 0.17)
    assert rel_error(got, want) < 1e-2


@pytest.mark.parametrize("per_token", [False, True])
def test_fp8_cache_with_scales(per_token):
    arrays, t = _case([2, 1], [9, 6], ckv=256, seed=5)
    fp8 = dict(t, ckv_cache=t["ckv_cache"].to(E4M3), kpe_cache=t["kpe_cache"].to(E4M3))
    w = _plan(arrays, 4, True, dtype=torch.bfloat16, kv_dtype=E4M3, ckv=256)
    q = {k: fp8[k].to(torch.bfloat16) for k in ("q_nope", "q_pe")}
    if per_token:  # a scale per token and 128-channel group: constant here, 0.5
        arr = torch.full(fp8["ckv_cache"].shape[:-1] + (2,), 0.5)
        got = w.run(**q, ckv_cache=fp8["ckv_cache"], kpe_cache=fp8["kpe_cache"],
                    ckv_scale_arr=arr, kpe_scale=2.0)
    else:
        got = w.run(**q, ckv_cache=fp8["ckv_cache"], kpe_cache=fp8["kpe_cache"], ckv_scale=0.5,
                    kpe_scale=2.0)
    ref = {k: v.float() for k, v in q.items()}
    ref.update(ckv_cache=fp8["ckv_cache"].float(), kpe_cache=fp8["kpe_cache"].float())
    want, _ = naive(arrays, ref, 4, True, 0.17, ckv_scale=0.5, kpe_scale=2.0)
    assert rel_error(got, want) < 1e-2


@pytest.mark.parametrize("change, words", [
    (dict(kv_len_arr=torch.tensor([9, 40], dtype=I32)), r"kv_len_arr\[1\]=40"),
    (dict(kv_len_arr=torch.tensor([9, -1], dtype=I32)), ">= 0"),
    (dict(kv_indices=torch.tensor([0, 1, 2, -4, 3], dtype=I32)), ">= 0"),
    (dict(kv_indices=torch.tensor([0, 1], dtype=I32)), "hold kv_indptr"),
    (dict(kv_indptr=torch.tensor([0, 3, 2], dtype=I32)), "non-decreasing"),
    (dict(qo_indptr=torch.tensor([0, 1, 2], dtype=torch.int64)), "int32"),
    (dict(sm_scale=None), "sm_scale"),
    (dict(head_dim_kpe=-1), "head_dim_kpe"),
    (dict(q_data_type="int8"), "q_data_type"),
])
def test_plan_refusals(change, words):
    arrays, _ = _case([1, 1], [9, 7])
    args = dict(arrays, num_heads=4, head_dim_ckv=32, head_dim_kpe=8, page_size=4, causal=False,
                sm_scale=0.2, q_data_type=torch.float32, kv_data_type=torch.float32)
    args.update(change)
    w = flashinfer.BatchMLAPagedAttentionWrapper(_ws())
    with pytest.raises((ValueError, TypeError), match=words):
        w.plan(**args)


def test_run_refusals():
    arrays, t = _case([1, 1], [9, 7])
    w = flashinfer.BatchMLAPagedAttentionWrapper(_ws())
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(**t)
    w = _plan(arrays, 4, False)
    bad = [
        (dict(t, q_nope=t["q_nope"].half()), "q_nope must be torch.float32"),
        (dict(t, q_pe=t["q_pe"][:, :2]), "q_pe must be"),
        (dict(t, ckv_cache=t["ckv_cache"][:2]), "page id"),  # the plan's ids exceed 2 pages
        (dict(t, kpe_cache=t["kpe_cache"][..., :4]), "kpe_cache must be"),
        (dict(t, ckv_scale=0.5), "fp8 cache"),
        (dict(t, out=torch.empty(2, 4, 16)), "out must be"),
        (dict(t, page_table=torch.zeros(2, 3, dtype=I32)), "page_table"),
    ]
    for kwargs, words in bad:
        with pytest.raises((ValueError, NotImplementedError), match=words):
            w.run(**kwargs)
    fp8 = _plan(arrays, 4, False, dtype=torch.bfloat16, kv_dtype=E4M3)
    q = {k: t[k].bfloat16() for k in ("q_nope", "q_pe")}
    caches = dict(ckv_cache=t["ckv_cache"].to(E4M3), kpe_cache=t["kpe_cache"].to(E4M3))
    with pytest.raises(ValueError, match="exactly one"):
        fp8.run(**q, **caches, kpe_scale=1.0)
    with pytest.raises(ValueError, match="ckv_scale_arr must be"):
        fp8.run(**q, **caches, kpe_scale=1.0, ckv_scale_arr=torch.ones(3))


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton on the CPU runs in the interpreter "
                    "only without a GPU (test_mla_gpu.py covers the GPU)")
def test_cuda_graph_plan_goes_to_the_capturable_kernel():
    """The fixed buffers are checked and written; the reference walks plan()'s host lengths
    (not capturable), so a CUDA-graph plan goes to the Triton kernel (in the interpreter here)."""
    arrays, _ = _case([1, 1], [9, 7])
    bufs = dict(qo_indptr=torch.zeros(3, dtype=I32), kv_indptr=torch.zeros(3, dtype=I32),
                kv_indices=torch.zeros(16, dtype=I32), kv_len_arr=torch.zeros(2, dtype=I32))
    w = _plan(arrays, 4, False, dtype=torch.bfloat16, use_cuda_graph=True, **bufs)
    assert w.decision.backend == "triton"
    assert torch.equal(bufs["kv_len_arr"], arrays["kv_len_arr"])
    with pytest.raises(NoBackendError, match="CUDA-graph replay"):
        _plan(arrays, 4, False, backend="reference", use_cuda_graph=True, **bufs)
    with pytest.raises(TypeError, match="int32"):
        flashinfer.BatchMLAPagedAttentionWrapper(_ws(), use_cuda_graph=True, **dict(
            bufs, kv_indices=None))


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton on the CPU runs in the interpreter "
                    "only without a GPU (test_mla_gpu.py covers the GPU)")
def test_cuda_graph_wrapper_keeps_its_first_kernel():
    """A CUDA-graph wrapper's later plans run its first plan's kernel (what a captured graph
    replays); one that kernel cannot serve is refused, naming it."""
    arrays, _ = _case([1, 1], [9, 7])
    bufs = dict(qo_indptr=torch.zeros(3, dtype=I32), kv_indptr=torch.zeros(3, dtype=I32),
                kv_indices=torch.zeros(16, dtype=I32), kv_len_arr=torch.zeros(2, dtype=I32))
    w = _plan(arrays, 4, False, dtype=torch.bfloat16, use_cuda_graph=True, **bufs)
    assert w._graph_kernel == "triton"
    again = lambda: w.plan(*(arrays[k] for k in ("qo_indptr", "kv_indptr", "kv_indices",  # noqa: E731
                                                 "kv_len_arr")),
                           4, 32, 8, 4, False, 0.17, torch.bfloat16, torch.bfloat16)
    again()
    assert w.decision.name == "triton"
    w._graph_kernel = "flashmla"  # as if the first plan had been FlashMLA's (SM 9.0)
    with pytest.raises(ValueError, match="first plan runs flashmla"):
        again()


@pytest.mark.parametrize("sm, page_size, kv, features, heads, rows, want", [
    ("7.5", 64, "bfloat16", (), 128, 64, "reference"),
    ("8.0", 64, "bfloat16", (), 128, 64, "triton"),
    ("8.9", 1, "float8_e4m3fn", (), 128, 64, "triton"),
    ("9.0", 64, "bfloat16", ("causal", "multi_query"), 128, 64, "flashmla"),
    ("9.0", 64, "bfloat16", (), 128, 1, "flashmla"),
    ("9.0", 1, "bfloat16", (), 128, 64, "flashmla:sparse"),
    ("9.0", 16, "bfloat16", ("causal", "multi_query", "varying_qo_len"), 64, 64,
     "flashmla:sparse"),
    ("9.0", 64, "bfloat16", ("multi_query", "varying_qo_len"), 128, 64, "flashmla:sparse"),
    ("9.0", 1, "bfloat16", (), 128, 4, "triton"),  # few rows: the split-K kernel
    ("9.0", 1, "bfloat16", (), 16, 64, "triton"),
    ("9.0", 64, "float8_e4m3fn", ("fp8_kv",), 128, 64, "flashmla:dequant"),
    ("9.0", 1, "float8_e4m3fn", ("fp8_kv",), 128, 64, "flashmla:dequant"),
    ("9.0", 64, "float8_e4m3fn", ("fp8_kv",), 16, 64, "triton"),  # memory-bound: Triton's
    ("9.0", 64, "float8_e4m3fn", ("fp8_kv", "cuda_graph"), 128, 64, "flashmla:dequant_graph"),
    ("9.0", 1, "float8_e4m3fn", ("fp8_kv", "cuda_graph"), 128, 4, "flashmla:dequant_graph"),
    ("9.0", 64, "float8_e4m3fn", ("fp8_kv", "cuda_graph"), 16, 64, "triton"),
    ("9.0", 64, "bfloat16", ("separate_caches",), 128, 64, "triton"),
    ("9.0", 64, "bfloat16", ("cuda_graph",), 128, 64, "flashmla"),
    ("9.0", 1, "bfloat16", ("cuda_graph",), 128, 64, "triton"),  # (sparse: not capturable)
    ("10.0", 64, "bfloat16", (), 128, 64, "triton"),
    ("12.0", 16, "bfloat16", ("cuda_graph",), 128, 64, "triton"),
    (None, 64, "bfloat16", (), 128, 64, "reference"),
])
def test_decision_on_simulated_sms(sm, page_size, kv, features, heads, rows, want, monkeypatch):
    """SM 9.0: FlashMLA's dense decode at page 64 (bf16, one q_len, a joint cache), its sparse
    kernel at other pages and varying q_len (64 / 128 heads, more than 4 rows), fp8 caches at
    many heads gathered into bf16 for the dense decode (in CUDA graphs too); Triton on every other GPU problem from
    SM 8.0, the reference below and on the CPU."""
    from flashinfer import capability_db, dispatch

    real = capability_db.import_error  # flash_mla counts as installed
    monkeypatch.setattr(capability_db, "import_error", lambda m: None if m == "flash_mla" else real(m))
    dispatch.clear_cache()
    problem = Problem.make("batch_mla", simulated(sm),
                           dtypes={"q": "bfloat16", "kv": kv, "o": "bfloat16"},
                           shape={"num_heads": heads, "head_dim_ckv": 512, "head_dim_kpe": 64,
                                  "batch_size": rows, "max_qo_len": 1, "max_kv_len": 4096,
                                  "total_qo_len": rows, "page_size": page_size},
                           features=set(features))
    assert select(problem).name == want
    dispatch.clear_cache()


@pytest.mark.parametrize("heads, rows, kv_len, want", [
    (128, 16, 1024, "flashmla:sparse"), (128, 64, 1024, "flashmla:sparse"),
    (128, 128, 1024, "flashmla"), (128, 64, 4096, "flashmla"), (16, 64, 1024, "flashmla"),
])
def test_short_keys_at_page_64_go_to_the_sparse_kernel(heads, rows, kv_len, want, monkeypatch):
    """SM 9.0, page 64: keys of at most 1,024 tokens over 5-64 rows run the sparse kernel
    (one launch) rather than the dense decode's split and combine passes."""
    from flashinfer import capability_db, dispatch

    real = capability_db.import_error
    monkeypatch.setattr(capability_db, "import_error", lambda m: None if m == "flash_mla" else real(m))
    dispatch.clear_cache()
    problem = Problem.make("batch_mla", simulated("9.0"),
                           dtypes={"q": "bfloat16", "kv": "bfloat16", "o": "bfloat16"},
                           shape={"num_heads": heads, "head_dim_ckv": 512, "head_dim_kpe": 64,
                                  "batch_size": rows, "max_qo_len": 1, "max_kv_len": kv_len,
                                  "total_qo_len": rows, "page_size": 64}, features=set())
    assert select(problem).name == want
    dispatch.clear_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 64])
def test_gpu_deepseek_shapes_match_the_cpu(page_size):
    """DeepSeek's 128 heads, 512 + 64, bf16, MTP (2 tokens per request), on CUDA vs the CPU."""
    arrays, t = _case([2, 2, 2], [300, 64, 1000], page_size=page_size, heads=128, ckv=512,
                      kpe=64, seed=9)
    half = {k: v.to(torch.bfloat16) for k, v in t.items()}
    outs = []
    for device in ("cpu", "cuda"):
        w = _plan(arrays, page_size, True, sm_scale=192 ** -0.5, dtype=torch.bfloat16,
                  heads=128, ckv=512, kpe=64, device=device)
        outs.append(w.run(**{k: v.to(device) for k, v in half.items()}, return_lse=True))
    torch.testing.assert_close(outs[1][0].cpu().float(), outs[0][0].float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outs[1][1].cpu(), outs[0][1], rtol=1e-3, atol=1e-3)


def test_exported_as_upstream():
    assert flashinfer.mla.BatchMLAPagedAttentionWrapper is flashinfer.BatchMLAPagedAttentionWrapper


@pytest.mark.parametrize("backend", ["reference"] + ([] if torch.cuda.is_available() else
                                                     ["triton"]))  # (interpreter: CPU only)
def test_append_paged_mla_kv_cache_then_attend(backend):
    """Tokens appended with append_paged_mla_kv_cache land where the MLA wrapper reads them:
    the caches equal ones written token by token, and bad page ids are refused as the plain
    append refuses them."""
    arrays, t = _case([1, 1], [9, 6], seed=11)
    ckv, kpe = torch.zeros_like(t["ckv_cache"]), torch.zeros_like(t["kpe_cache"])
    want_ckv, want_kpe = ckv.clone(), kpe.clone()
    lens = arrays["kv_len_arr"].tolist()
    batch = torch.cat([torch.full((n,), b, dtype=I32) for b, n in enumerate(lens)])
    positions = torch.cat([torch.arange(n, dtype=I32) for n in lens])
    new_ckv, new_kpe = torch.randn(sum(lens), 32), torch.randn(sum(lens), 8)
    ids, kvp = arrays["kv_indices"].tolist(), arrays["kv_indptr"].tolist()
    for i, (b, p) in enumerate(zip(batch.tolist(), positions.tolist())):
        page, slot = ids[kvp[b] + p // 4], p % 4
        want_ckv[page, slot], want_kpe[page, slot] = new_ckv[i], new_kpe[i]
    with flashinfer.use_backend(attention=backend):
        flashinfer.append_paged_mla_kv_cache(new_ckv, new_kpe, batch, positions, ckv, kpe,
                                             arrays["kv_indices"], arrays["kv_indptr"],
                                             torch.ones(2, dtype=I32))
    assert torch.equal(ckv, want_ckv) and torch.equal(kpe, want_kpe)
    with pytest.raises(ValueError, match="positions"):
        flashinfer.page.append_paged_mla_kv_cache(new_ckv, new_kpe, batch, positions + 8, ckv,
                                                  kpe, arrays["kv_indices"], arrays["kv_indptr"],
                                                  torch.ones(2, dtype=I32))


def _block_table(arrays, width):
    """[batch, width] page ids from the case's page indptr / indices, padding -9 (never read)."""
    kvp, ids = arrays["kv_indptr"].tolist(), arrays["kv_indices"]
    table = torch.full((len(kvp) - 1, width), -9, dtype=I32)
    for b in range(len(kvp) - 1):
        table[b, :kvp[b + 1] - kvp[b]] = ids[kvp[b]:kvp[b + 1]]
    return table


@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("four_d", [False, True])
def test_trtllm_mla_convention_matches_the_wrapper(q_len, four_d):
    """query [B, q_len, H, 576-like], one [pages, (1,) page_size, 576-like] cache, a block table;
    bmm1_scale the score scale, bmm2_scale the output's; lse [B * q_len, H] base 2."""
    from flashinfer.mla import trtllm_batch_decode_with_kv_cache_mla as trtllm

    arrays, t = _case([q_len] * 3, [9, 1, 16], seed=12)
    want, want_lse = naive(arrays, t, 4, q_len > 1, 0.3)
    query = torch.cat([t["q_nope"], t["q_pe"]], -1).view(3, q_len, 4, 40)
    cache = torch.cat([t["ckv_cache"], t["kpe_cache"]], -1)
    cache = cache.unsqueeze(1) if four_d else cache
    args = (query, cache, _ws(), 128, 32, 8, _block_table(arrays, 5),
            arrays["kv_len_arr"], 16)
    out, lse = trtllm(*args, bmm1_scale=0.3, bmm2_scale=0.5, return_lse=True)
    assert out.shape == (3, q_len, 4, 32) and out.dtype == torch.bfloat16
    assert rel_error(out.float().view(-1, 4, 32), want * 0.5) < 1e-2
    _assert_lse(lse, want_lse)
    buf, given = torch.full((3, q_len, 4), float("nan")), torch.empty(3, q_len, 4, 32)
    only = trtllm(*args, bmm1_scale=torch.tensor(0.3), out=given, lse=buf)
    assert only is given
    _assert_lse(buf.view(-1, 4), want_lse)
    assert rel_error(given.view(-1, 4, 32), want) < 1e-5
    if q_len == 1:
        xqa = flashinfer.mla.xqa_batch_decode_with_kv_cache_mla(*args, bmm1_scale=0.3)
        assert rel_error(xqa.float().view(-1, 4, 32), want) < 1e-2
        assert flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla is trtllm


def test_trtllm_mla_fp8_cache():
    from flashinfer.mla import trtllm_batch_decode_with_kv_cache_mla as trtllm

    arrays, t = _case([1, 1], [9, 6], ckv=128, seed=13)
    cache = torch.cat([t["ckv_cache"], t["kpe_cache"]], -1).to(E4M3)
    query = torch.cat([t["q_nope"], t["q_pe"]], -1).view(2, 1, 4, 136).to(E4M3)
    out = trtllm(query, cache, _ws(), 128, 128, 8, _block_table(arrays, 4), arrays["kv_len_arr"],
                 9, bmm1_scale=0.2)
    ref = dict(q_nope=query.float().view(2, 4, 136)[..., :128],
               q_pe=query.float().view(2, 4, 136)[..., 128:],
               ckv_cache=cache.float()[..., :128], kpe_cache=cache.float()[..., 128:])
    assert rel_error(out.float().view(2, 4, 128), naive(arrays, ref, 4, False, 0.2)[0]) < 1e-2


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(sparse_mla_top_k=64), NotImplementedError, "sparse"),
    (dict(cum_seq_lens_q=torch.zeros(3, dtype=I32)), NotImplementedError, "cum_seq_lens_q"),
    (dict(sinks=torch.zeros(4)), NotImplementedError, "sinks"),
    (dict(kv_lora_rank=16), ValueError, "kv_lora_rank"),
])
def test_trtllm_mla_refusals(kwargs, exc, words):
    arrays, t = _case([1, 1], [9, 6])
    args = dict(query=torch.cat([t["q_nope"], t["q_pe"]], -1).view(2, 1, 4, 40),
                kv_cache=torch.cat([t["ckv_cache"], t["kpe_cache"]], -1), workspace_buffer=_ws(),
                qk_nope_head_dim=128, kv_lora_rank=32, qk_rope_head_dim=8,
                block_tables=_block_table(arrays, 4), seq_lens=arrays["kv_len_arr"],
                max_seq_len=9)
    args.update(kwargs)
    with pytest.raises(exc, match=words):
        flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla(**args)
    with pytest.raises(ValueError, match="one query token"):
        flashinfer.mla.xqa_batch_decode_with_kv_cache_mla(
            args["query"].expand(2, 2, 4, 40), *list(args.values())[1:9])


def test_legacy_decode_mla_wrapper():
    """BatchDecodeMlaWithPagedKVCacheWrapper: lengths from last_page_len, one token per request,
    q_scale * k_scale on the scores, v_scale on the output; window / soft cap refused."""
    arrays, t = _case([1, 1, 1], [9, 4, 13], kpe=64, seed=14)
    lens = arrays["kv_len_arr"]
    pages = arrays["kv_indptr"][1:] - arrays["kv_indptr"][:-1]
    last = (lens - (pages - 1) * 4).to(I32)
    w = flashinfer.BatchDecodeMlaWithPagedKVCacheWrapper(_ws())
    w.plan(arrays["kv_indptr"], arrays["kv_indices"], last, 4, 32, 4, 0.25,
           data_type=torch.float32)
    out, lse = w.run(t["q_nope"], t["q_pe"], t["ckv_cache"], t["kpe_cache"], q_scale=2.0,
                     k_scale=0.5, v_scale=3.0, return_lse=True)
    want, want_lse = naive(arrays, t, 4, False, 0.25)
    assert rel_error(out, want * 3.0) < 1e-5
    _assert_lse(lse, want_lse)
    assert rel_error(w.run_return_lse(t["q_nope"], t["q_pe"], t["ckv_cache"],
                                      t["kpe_cache"])[1], want_lse) < 1e-5
    assert w.decision.backend == "reference" and not w.is_cuda_graph_enabled
    with pytest.raises(NotImplementedError, match="window"):
        w.plan(arrays["kv_indptr"], arrays["kv_indices"], last, 4, 32, 4, 0.25, window_left=8)
    with pytest.raises(ValueError, match="last_page_len"):
        w.plan(arrays["kv_indptr"], arrays["kv_indices"], last + 4, 4, 32, 4, 0.25)


def test_page_ids_rewritten_after_plan_are_checked_at_run():
    """The reference reads the page ids at run time: one rewritten past the caches after plan()
    raises on the CPU (on a GPU it is recorded for flashinfer.check_errors() and read as page 0,
    test_gpu_bad_page_id_is_recorded)."""
    arrays, t = _case([1, 1], [9, 7])
    w = _plan(arrays, 4, False)
    w._plan.kv_indices[1] = 99
    with pytest.raises(ValueError, match="kv_indices"):
        w.run(**t)


@pytest.mark.gpu
def test_gpu_bad_page_id_is_recorded():
    arrays, t = _case([1, 1], [9, 7])
    w = _plan(arrays, 4, False, device="cuda")
    w._plan.kv_indices[1] = 99
    flashinfer.check_errors()  # (a clean record first)
    out = w.run(**{k: v.cuda() for k, v in t.items()})
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="kv_indices"):
        flashinfer.check_errors()


@pytest.mark.parametrize("pages", [[3, 3, 3], [2, 0, 5, 1], []])
def test_flashmla_host_arrays_match_the_naive_tables(pages):
    """The arrays the FlashMLA planners put in the plan's upload (numpy, no flash_mla needed):
    the dense block table (rows of page ids, 0 past a request's pages) and the sparse kernel's
    per-row request, token count and empty rows."""
    import numpy as np

    from flashinfer.attention.mla_params import MLAPlan
    from flashinfer.backends.flashmla import decode, sparse

    gen = torch.Generator().manual_seed(len(pages))
    batch, page = len(pages), 4
    kv_indptr = torch.tensor([0] + list(np.cumsum(pages)), dtype=torch.int32)
    ids = torch.randperm(int(kv_indptr[-1]) + 3, generator=gen, dtype=torch.int32)
    lens = torch.tensor([max(0, p * page - 1) for p in pages], dtype=torch.int32)
    q_lens = [2] * batch
    qo_indptr = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32)
    plan = MLAPlan(torch.device("cpu"), batch, 64, 512, 64, page, torch.bfloat16, torch.bfloat16,
                   torch.bfloat16, True, 0.1, qo_indptr.numpy(), kv_indptr.numpy(), lens.numpy(),
                   qo_indptr, kv_indptr, ids, lens, int(qo_indptr[-1]), 2,
                   int(lens.max()) if batch else 0, None, kv_indices_host=ids.numpy())
    width = max([1] + pages)
    want = [[int(ids[kv_indptr[b] + j]) if j < pages[b] else 0 for j in range(width)]
            for b in range(batch)]
    assert decode._host_table(plan).reshape(batch, width).tolist() == want
    arrays = sparse._host_arrays(plan)
    rows = [b for b in range(batch) for _ in range(2)]
    seen = [max(0, int(lens[b]) - 2 + i + 1) for b in range(batch) for i in range(2)]
    assert arrays[sparse.ROW_REQUEST].tolist() == rows
    if len(set(seen)) > 1:
        assert arrays[sparse.TOPK_LENGTH].tolist() == seen
    assert arrays.get(sparse.EMPTY_ROWS, np.zeros(0)).tolist() == [i for i, s in enumerate(seen) if s == 0]
