"""flash_attn adapter (variants fa3 and fa2): plumbing on CPU, decisions on simulated SMs, GPU runs.

On CPU the vendor entry points (``fa3_varlen`` / ``fa2_varlen``) are replaced by a float64
emulation of FlashAttention's varlen forward: its argument conventions (int32 cu_seqlens, the
``(left, right)`` window with ``max_seqlen_k`` clamping, bottom-right causal, softcap after the
scale), natural-log lse ``[H, total_q]`` with ``+inf`` for rows that see no key. The adapter's
output must then match a naive float64 computation of the batch contract (the emulation and the
naive computation live in attention_helpers.py). GPU tests run the real modules against a
float32 computation.
"""

import dataclasses

import pytest
import torch

from attention_helpers import (SMS, assert_lse_close, candidate, make_plan,
                               naive_batch, ragged_inputs, ragged_problem, run_planner)
from attention_helpers import emulated_fa_calls  # noqa: F401 - the `calls` fixture
from conftest import capture_cuda_graph, HAS_CUDA, TOLERANCE, poison, rel_error
from flashinfer.attention.params import AttentionParams
from flashinfer.backends.flash_attn import attention as fa
from flashinfer.dispatch import kernel_for
from flashinfer.attention.batch_params import KVInput, RunScales
from flashinfer.device import simulated
from flashinfer.dispatch import Problem, select


# --- ragged prefill: the planner against the naive batch contract ----------------------------

RAGGED_CASES = [
    # qo_lens, kv_lens, plan kwargs
    ([5, 1, 7], [5, 9, 12], {}),
    ([4, 6, 3], [4, 10, 2], {"causal": True}),  # last request: more queries than keys
    ([3, 8], [11, 8], {"causal": True, "window_left": 3}),
    ([6, 2], [6, 7], {"causal": True, "soft_cap": 2.5}),
    ([2, 3], [0, 5], {}),  # a request with no keys
    ([3, 4], [7, 4], {"num_qo_heads": 4, "num_kv_heads": 4}),
    ([3, 4], [7, 4], {"num_qo_heads": 6, "num_kv_heads": 1, "causal": True}),
]


@pytest.mark.parametrize("variant", ["fa3", "fa2"])
@pytest.mark.parametrize("qo_lens, kv_lens, kw", RAGGED_CASES)
def test_ragged_planner_plumbing(variant, qo_lens, kv_lens, kw, calls):
    plan = make_plan(qo_lens, kv_lens, **kw)
    q, k, v = ragged_inputs(plan, hnd=True)
    planner = kernel_for("flash_attn", "batch_prefill_ragged", variant)
    out, lse = run_planner(planner, plan, q, k, v)
    want_out, want_lse = naive_batch(
        q, k, v, qo_lens, kv_lens, sm_scale=plan.sm_scale, causal=plan.causal,
        window_left=plan.window_left, soft_cap=plan.logits_soft_cap)
    assert rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    (call,) = calls
    assert call["cu_q"] is plan.qo_indptr and call["cu_k"] is plan.kv_indptr
    assert (call["max_q"], call["max_k"]) == (plan.max_qo_len, plan.max_kv_len)


@pytest.mark.parametrize("variant", ["fa3", "fa2"])
def test_ragged_scales_and_output_dtype(variant, calls):
    plan = make_plan([4, 3], [6, 3], causal=True, o_dtype=torch.float64)
    q, k, v = ragged_inputs(plan, seed=1)
    scales = RunScales(q_scale=0.5, k_scale=1.5, v_scale=0.25)
    planner = kernel_for("flash_attn", "batch_prefill_ragged", variant)
    out, lse = run_planner(planner, plan, q, k, v, scales=scales)
    want_out, want_lse = naive_batch(q, k, v, [4, 3], [6, 3], sm_scale=plan.sm_scale, causal=True,
                                     q_scale=0.5, k_scale=1.5, v_scale=0.25)
    assert out.dtype == torch.float64
    assert rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    assert calls[0]["scale"] == pytest.approx(plan.sm_scale * 0.75)


@pytest.mark.parametrize("variant", ["fa3", "fa2"])
def test_ragged_without_lse_and_window_argument(variant, calls):
    plan = make_plan([5], [9], causal=True, window_left=2)
    q, k, v = ragged_inputs(plan, seed=2)
    out, lse = run_planner(kernel_for("flash_attn", "batch_prefill_ragged", variant), plan, q, k, v,
                           lse=False)
    assert lse is None
    want, _ = naive_batch(q, k, v, [5], [9], sm_scale=plan.sm_scale, causal=True, window_left=2)
    assert rel_error(out, want) < TOLERANCE[torch.float32]
    assert calls[0]["window"] == (2, 0) and calls[0]["causal"] is True


def test_fa3_head_dim_differs(calls):
    plan = make_plan([3, 5], [4, 6], head_dim_qk=48, head_dim_vo=16, causal=True)
    q, k, v = ragged_inputs(plan, seed=3)
    out, lse = run_planner(kernel_for("flash_attn", "batch_prefill_ragged", "fa3"), plan, q, k, v)
    want_out, want_lse = naive_batch(q, k, v, [3, 5], [4, 6], sm_scale=plan.sm_scale, causal=True)
    assert out.shape[-1] == 16 and rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])


@pytest.mark.parametrize("variant", ["fa3", "fa2"])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("v_scale", [1.0, 0.5])
def test_runner_makes_its_output(variant, paged, v_scale, calls, monkeypatch):
    """out=None (the runners' makes_output): the kernel's own output is returned, in q's dtype,
    no buffer is passed to the kernel; lse and v_scale are applied as with a given out."""
    given_out, emulated = [], getattr(fa, f"{variant}_varlen")
    monkeypatch.setattr(fa, f"{variant}_varlen", lambda *a, **kw: (
        given_out.append(kw.get("out") is not None), emulated(*a, **kw))[1])
    qo_lens, kv_lens = [3, 5, 2], [4, 9, 0]
    if paged:
        plan, q, k_cache, v_cache, k, v = make_paged(qo_lens, kv_lens, page_size=4)
        kv = KVInput(k_cache, v_cache)
    else:
        plan = make_plan(qo_lens, kv_lens, causal=True)
        q, k, v = ragged_inputs(plan, seed=9)
        kv = KVInput(k, v)
    runner = kernel_for("flash_attn", "batch_prefill_paged" if paged else "batch_prefill_ragged",
                        variant)(plan)
    assert runner.makes_output is True
    lse = poison(torch.empty(plan.total_qo, plan.num_qo_heads))
    out = runner(q, kv, None, lse, RunScales(v_scale=v_scale))
    want_out, want_lse = naive_batch(q, k, v, qo_lens, kv_lens, sm_scale=plan.sm_scale,
                                     causal=plan.causal, v_scale=v_scale)
    assert out.dtype == q.dtype and out.shape == (plan.total_qo, plan.num_qo_heads, plan.head_dim_vo)
    assert rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    assert given_out == [False]  # the kernel allocated the output


def test_runner_makes_output_with_no_rows_or_keys(calls):
    """out=None where no kernel runs: an output is still made (empty, or 0 for keyless rows)."""
    plan = make_plan([2, 1], [0, 0])
    q, k, v = ragged_inputs(plan, seed=10)
    out = kernel_for("flash_attn", "batch_prefill_ragged", "fa3")(plan)(
        q, KVInput(k, v), None, None, RunScales())
    assert out.shape == (3, plan.num_qo_heads, plan.head_dim_vo) and torch.equal(out, torch.zeros_like(out))
    assert calls == []


@pytest.mark.parametrize("variant", ["fa3", "fa2"])
@pytest.mark.parametrize("op, qo_len, causal, window_left", [
    ("single_prefill", 7, True, -1), ("single_prefill", 5, False, -1),
    ("single_prefill", 6, True, 2), ("single_decode", 1, False, -1), ("single_decode", 1, False, 3),
])
def test_single_kernels(variant, op, qo_len, causal, window_left, calls):
    torch.manual_seed(4)
    kv_len = 11
    q, k, v = torch.randn(qo_len, 4, 16), torch.randn(kv_len, 2, 16), torch.randn(kv_len, 2, 16)
    params = AttentionParams(sm_scale=0.3, causal=causal, window_left=window_left,
                             return_lse=True, o_dtype=torch.float64)
    out, lse = kernel_for("flash_attn", op, variant)(q, k, v, params)
    want_out, want_lse = naive_batch(q, k, v, [qo_len], [kv_len], sm_scale=0.3,
                                     causal=causal or qo_len == 1, window_left=window_left)
    assert out.dtype == torch.float64 and rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    assert calls[0]["cu_q"].tolist() == [0, qo_len] and calls[0]["cu_k"].tolist() == [0, kv_len]


# --- paged prefill: gather then varlen ------------------------------------------------------

def make_paged(qo_lens, kv_lens, *, page_size, layout="NHD", spare_pages=3, split5d=False,
               dtype=torch.float32, device="cpu", seed=0, **kw):
    """``(plan, q, k_cache, v_cache, k, v)``: a paged-prefill plan whose requests own shuffled
    pages of a cache with spare pages, and the same K/V as contiguous rows for the naive check.
    ``split5d``: the caches are the two halves of one 5-D cache (non-contiguous views)."""
    ragged = make_plan(qo_lens, kv_lens, dtype=dtype, device=device, **kw)
    pages_per = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages_per) + spare_pages
    # the page table depends on the lengths only (a CUDA-graph replay keeps it, fresh data)
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(len(kv_lens)))
    order = order[:sum(pages_per)].to(torch.int32)
    torch.manual_seed(seed)
    kv_indptr = torch.tensor([0] + pages_per).cumsum(0).to(torch.int32)
    last = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages_per)],
                        dtype=torch.int32)
    plan = dataclasses.replace(
        ragged, op="batch_prefill_paged", page_size=page_size, kv_layout=layout,
        kv_indptr_host=kv_indptr, kv_indptr=kv_indptr.to(device), kv_indices=order.to(device),
        kv_last_page_len_host=last, kv_last_page_len=last.to(device))
    h, dqk, dvo = plan.num_kv_heads, plan.head_dim_qk, plan.head_dim_vo
    q = torch.randn(plan.total_qo, plan.num_qo_heads, dqk).to(dtype).to(device)
    both = torch.randn(num_pages, 2, page_size, h, max(dqk, dvo)).to(dtype).to(device)
    if layout == "HND":
        both = both.transpose(2, 3)
    if not split5d:
        both = both.contiguous()
    k_cache, v_cache = both[:, 0, ..., :dqk], both[:, 1, ..., :dvo]
    if not split5d:
        k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    k, v = [], []
    for b, n in enumerate(kv_lens):
        for t in range(n):
            page = int(order[int(kv_indptr[b]) + t // page_size])
            for cache, rows in ((k_cache, k), (v_cache, v)):
                rows.append(cache[page, t % page_size] if layout == "NHD" else cache[page, :, t % page_size])
    empty = torch.empty(0, h, dqk, dtype=dtype, device=device)
    k = torch.stack(k) if k else empty
    v = torch.stack(v) if v else empty[..., :dvo]
    return plan, q, k_cache, v_cache, k, v


def run_paged(variant, plan, q, k_cache, v_cache, *, lse=True, scales=RunScales()):
    planner = kernel_for("flash_attn", "batch_prefill_paged", variant)
    out = poison(torch.empty(plan.total_qo, plan.num_qo_heads, plan.head_dim_vo,
                             dtype=plan.o_dtype, device=plan.device))
    lse_buf = poison(torch.empty(plan.total_qo, plan.num_qo_heads, device=plan.device)) if lse else None
    planner(plan)(q, KVInput(k_cache, v_cache), out, lse_buf, scales)
    return out, lse_buf


PAGED_CASES = [
    ([5, 1, 7], [5, 9, 18], {}),
    ([4, 6, 3], [4, 17, 2], {"causal": True}),
    ([6, 2], [6, 33], {"causal": True, "soft_cap": 2.5}),
    ([2, 3, 4], [0, 5, 16], {"causal": True}),  # a request with no pages
    ([3, 4], [7, 4], {"num_qo_heads": 6, "num_kv_heads": 1}),
]


@pytest.mark.parametrize("ids_on_host", [False, True])
def test_paged_gather_index(ids_on_host):
    import dataclasses

    plan, *_ = make_paged([1, 2, 3], [3, 0, 21], page_size=4)
    if ids_on_host:  # plan() keeps a host copy when the page ids were given on the host
        plan = dataclasses.replace(plan, kv_indices_host=plan.kv_indices.cpu().clone())
    page_ids, slots, cu_k = fa.paged_gather_index(plan)
    idx, ind = plan.kv_indices.tolist(), plan.kv_indptr_host.tolist()
    want = [(idx[ind[b] + t // 4], t % 4) for b, n in enumerate([3, 0, 21]) for t in range(n)]
    assert list(zip(page_ids.tolist(), slots.tolist())) == want
    assert page_ids.dtype == slots.dtype == torch.int64
    assert cu_k.dtype == torch.int32 and cu_k.tolist() == [0, 3, 3, 24]


@pytest.mark.parametrize("variant", ["fa3", "fa2"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("layout, split5d", [("NHD", False), ("HND", False), ("NHD", True),
                                             ("HND", True)])
@pytest.mark.parametrize("qo_lens, kv_lens, kw", PAGED_CASES)
def test_paged_planner_plumbing(variant, page_size, layout, split5d, qo_lens, kv_lens, kw, calls):
    plan, q, k_cache, v_cache, k, v = make_paged(qo_lens, kv_lens, page_size=page_size,
                                                 layout=layout, split5d=split5d, **kw)
    out, lse = run_paged(variant, plan, q, k_cache, v_cache)
    want_out, want_lse = naive_batch(q, k, v, qo_lens, kv_lens, sm_scale=plan.sm_scale,
                                     causal=plan.causal, soft_cap=plan.logits_soft_cap)
    assert rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    (call,) = calls
    assert call["cu_q"] is plan.qo_indptr
    assert call["cu_k"].dtype == torch.int32
    assert call["cu_k"].tolist() == [0] + torch.tensor(kv_lens).cumsum(0).tolist()
    assert (call["max_q"], call["max_k"]) == (plan.max_qo_len, plan.max_kv_len)
    assert torch.equal(call["k"], k) and torch.equal(call["v"], v)


@pytest.mark.parametrize("ids_on_host", [False, True])
def test_block_table_index(ids_on_host):
    plan, *_ = make_paged([1, 2, 3], [3, 0, 700], page_size=256)
    if ids_on_host:
        plan = dataclasses.replace(plan, kv_indices_host=plan.kv_indices.cpu().clone())
    table, cu_k = fa.block_table_index(plan)
    ids = plan.kv_indices.tolist()  # request 0: page 0; request 2: pages 1-3
    assert table.dtype == cu_k.dtype == torch.int32 and table.is_contiguous()
    assert table.tolist() == [[ids[0], ids[1], ids[2]], [ids[1], ids[2], ids[3]],
                              [ids[1], ids[2], ids[3]]]
    assert cu_k.tolist() == [0, 3, 3, 703]


@pytest.mark.parametrize("layout, split5d", [("NHD", False), ("HND", False), ("HND", True)])
@pytest.mark.parametrize("qo_lens, kv_lens, kw", [
    ([5, 1, 7], [5, 300, 520], {}),
    ([2, 3, 4], [0, 5, 257], {"causal": True}),  # a request with no pages
    ([6, 2], [6, 600], {"causal": True, "soft_cap": 2.5, "num_qo_heads": 6, "num_kv_heads": 1}),
])
def test_fa2_block_table_plumbing(layout, split5d, qo_lens, kv_lens, kw, calls):
    """Pages of 256: FA2 reads the cache in place (no gather) through the block table."""
    plan, q, k_cache, v_cache, k, v = make_paged(qo_lens, kv_lens, page_size=256, layout=layout,
                                                 split5d=split5d, spare_pages=1, **kw)
    out, lse = run_paged("fa2_block_table", plan, q, k_cache, v_cache,
                         scales=RunScales(q_scale=0.5, v_scale=2.0))
    want_out, want_lse = naive_batch(q, k, v, qo_lens, kv_lens, sm_scale=plan.sm_scale,
                                     causal=plan.causal, soft_cap=plan.logits_soft_cap,
                                     q_scale=0.5, v_scale=2.0)
    assert rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    paged, varlen = calls
    assert paged["k_cache"].data_ptr() == k_cache.data_ptr()  # the cache itself, no copy
    assert paged["k_cache"].shape[1] == 256  # [pages, page, H, D], HND seen through a transpose
    assert varlen["cu_k"].tolist() == [0] + torch.tensor(kv_lens).cumsum(0).tolist()


@pytest.mark.parametrize("kv_lens, layout, split5d, in_place", [
    ([8, 16, 5], "NHD", False, True),    # consecutive pages, only the last one part-used
    ([0, 8, 3], "NHD", False, True),     # (a request with no pages)
    ([5, 16, 8], "NHD", False, False),   # a hole inside: the gather
    ([8, 16, 5], "HND", False, False),   # the slots of a page are not one run of rows
    ([8, 16, 5], "NHD", True, False),    # k and v pages interleaved
])
def test_paged_consecutive_pages_read_in_place(kv_lens, layout, split5d, in_place, calls):
    """Host page ids p, p+1, ... whose tokens leave no hole (every request but the last fills its
    pages): the varlen kernel gets a view of the cache's rows, no gather; equal either way."""
    plan, q, k_cache, v_cache, _, _ = make_paged([2] * len(kv_lens), kv_lens, page_size=4,
                                                 layout=layout, split5d=split5d, causal=True)
    ids = torch.arange(2, 2 + int(plan.kv_indptr_host[-1]), dtype=torch.int32)
    plan = dataclasses.replace(plan, kv_indices=ids, kv_indices_host=ids)
    nhd = (lambda c: c) if layout == "NHD" else (lambda c: c.transpose(1, 2))
    def tokens(cache, dim):  # request b's first n tokens: the slots of its pages, in order
        return torch.cat([nhd(cache)[2 + int(plan.kv_indptr_host[b]):].reshape(
            -1, plan.num_kv_heads, dim)[:n] for b, n in enumerate(kv_lens)])
    k, v = tokens(k_cache, plan.head_dim_qk), tokens(v_cache, plan.head_dim_vo)
    for _ in range(2):
        calls.clear()
        out, lse = run_paged("fa3", plan, q, k_cache, v_cache)
        want_out, want_lse = naive_batch(q, k, v, [2] * len(kv_lens), kv_lens,
                                         sm_scale=plan.sm_scale, causal=True)
        assert rel_error(out, want_out) < TOLERANCE[torch.float32]
        assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
        (call,) = calls
        assert torch.equal(call["k"], k) and torch.equal(call["v"], v)
        viewed = call["k"].untyped_storage().data_ptr() == k_cache.untyped_storage().data_ptr()
        assert viewed == in_place


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_unflattenable_strides(layout, calls):
    """A page stride that is no multiple of the slot stride takes the advanced-indexing path."""
    plan, q, k_cache, v_cache, k, v = make_paged([3, 5], [9, 14], page_size=4, layout=layout,
                                                 causal=True)
    def skew(cache):
        size = cache.shape
        stride = (cache[0].numel() + 3,) + cache.stride()[1:]
        out = torch.full((size[0] * stride[0],), float("nan")).as_strided(size, stride)
        return out.copy_(cache)
    out, lse = run_paged("fa3", plan, q, skew(k_cache), skew(v_cache))
    want_out, want_lse = naive_batch(q, k, v, [3, 5], [9, 14], sm_scale=plan.sm_scale, causal=True)
    assert rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    assert torch.equal(calls[0]["k"], k)


@pytest.mark.parametrize("variant", ["fa3", "fa2"])
def test_paged_scales_dtype_and_repeat_runs(variant, calls):
    plan, q, k_cache, v_cache, k, v = make_paged([4, 3], [6, 19], page_size=8, causal=True,
                                                 o_dtype=torch.float64, seed=1)
    scales = RunScales(q_scale=0.5, k_scale=1.5, v_scale=0.25)
    runner = kernel_for("flash_attn", "batch_prefill_paged", variant)(plan)
    want_out, want_lse = naive_batch(q, k, v, [4, 3], [6, 19], sm_scale=plan.sm_scale,
                                     causal=True, q_scale=0.5, k_scale=1.5, v_scale=0.25)
    for _ in range(2):  # the second run reuses the plan's buffers and row index
        out = poison(torch.empty(7, plan.num_qo_heads, plan.head_dim_vo, dtype=torch.float64))
        lse = poison(torch.empty(7, plan.num_qo_heads))
        runner(q, KVInput(k_cache, v_cache), out, lse, scales)
        assert rel_error(out, want_out) < TOLERANCE[torch.float32]
        assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    assert calls[0]["k"] is calls[1]["k"]  # the preallocated gather buffer
    assert calls[0]["scale"] == pytest.approx(plan.sm_scale * 0.75)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("layout, split5d", [("NHD", False), ("HND", True)])
def test_paged_fp8_pages_widened_and_head_dims_differ(fp8, layout, split5d, calls):
    """fp8 pages are gathered into buffers of q's dtype (an exact widening) and the varlen
    kernel gets those; head_dim_qk != head_dim_vo goes through the same gather."""
    plan, q, k_cache, v_cache, k, v = make_paged([3, 5], [9, 21], page_size=4, layout=layout,
                                                 split5d=split5d, causal=True, head_dim_qk=48,
                                                 head_dim_vo=32)
    plan = dataclasses.replace(plan, kv_dtype=fp8)
    k_cache, v_cache = k_cache.to(fp8), v_cache.to(fp8)
    k, v = k.to(fp8).to(plan.q_dtype), v.to(fp8).to(plan.q_dtype)  # the values the cache holds
    out, lse = run_paged("fa3", plan, q, k_cache, v_cache)
    want_out, want_lse = naive_batch(q, k, v, [3, 5], [9, 21], sm_scale=plan.sm_scale, causal=True)
    assert rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    (call,) = calls
    assert call["k"].dtype == call["v"].dtype == plan.q_dtype
    assert torch.equal(call["k"], k) and torch.equal(call["v"], v)
    d = select(paged_problem("9.0", features=("causal", "fp8_kv")), assume_installed=True)
    assert candidate(d, "flash_attn:fa3").usable


def test_paged_all_empty(calls):
    plan, q, k_cache, v_cache, _, _ = make_paged([2, 1], [0, 0], page_size=4)
    out, lse = run_paged("fa3", plan, q, k_cache, v_cache)
    assert torch.equal(out, torch.zeros_like(out)) and bool(torch.isneginf(lse).all())
    assert calls == []


# --- decisions on simulated SMs -------------------------------------------------------------


@pytest.fixture
def fa3_package(monkeypatch):
    """Pretend the full FA3 package imports (the check then applies no wheel limits)."""
    real = fa.import_error
    monkeypatch.setattr(fa, "import_error", lambda m: None if m in fa.FA3_MODULES else real(m))


@pytest.fixture
def fa3_wheel_only(monkeypatch):
    """Pretend only the fa3_fwd wheel imports."""
    real = fa.import_error
    monkeypatch.setattr(fa, "import_error", lambda m: "import failed" if m == "flash_attn_interface"
                        else None if m == "fa3_fwd_interface" else real(m))


@pytest.mark.parametrize("sm", SMS)
def test_ragged_records_per_sm(sm, fa3_package):
    d = select(ragged_problem(sm), assume_installed=True)
    fa3, fa2 = candidate(d, "flash_attn:fa3"), candidate(d, "flash_attn:fa2")
    assert fa3.usable == (sm == "9.0")
    assert fa2.usable == (sm is not None and sm != "7.5")
    for cand in (fa3, fa2):
        if not cand.usable:
            assert {r.field for r in cand.reasons} == {"device" if sm is None else "sm"}
    if sm in ("8.0", "8.6", "8.9", "9.0", "12.0"):
        assert d.backend == "flash_attn"
        assert d.variant == ("fa3" if sm == "9.0" else "fa2")


def test_fa3_wheel_only_rejects_fp16_and_window(fa3_wheel_only):
    d = select(ragged_problem("9.0", dtype="float16"), assume_installed=True)
    assert [(r.field, r.actual) for r in candidate(d, "flash_attn:fa3").reasons] == [
        ("dtype.q", "float16")]
    assert candidate(d, "flash_attn:fa2").usable
    d = select(ragged_problem("9.0", features=("causal", "window")), assume_installed=True)
    assert [(r.field, r.actual) for r in candidate(d, "flash_attn:fa3").reasons] == [
        ("feature", "window")]
    assert candidate(select(ragged_problem("9.0"), assume_installed=True), "flash_attn:fa3").usable


def test_fa3_package_takes_fp16_and_window(fa3_package):
    for problem in (ragged_problem("9.0", dtype="float16"),
                    ragged_problem("9.0", features=("causal", "window"))):
        assert candidate(select(problem, assume_installed=True), "flash_attn:fa3").usable


@pytest.mark.parametrize("variant", ["fa3", "fa2"])
def test_window_needs_causal(variant, fa3_package):
    d = select(ragged_problem("9.0", features=("window",)), assume_installed=True)
    assert [(r.field, r.actual) for r in candidate(d, f"flash_attn:{variant}").reasons] == [
        ("feature", "window")]
    d = select(ragged_problem("9.0", op="single_decode", features=("window",)),
               assume_installed=True)
    assert candidate(d, f"flash_attn:{variant}").usable


@pytest.mark.parametrize("dqk, dvo, fa3_ok", [(192, 128, True), (64, 128, True),
                                               (128, 64, False), (256, 128, False)])
def test_head_dim_differs(dqk, dvo, fa3_ok, fa3_package):
    d = select(ragged_problem("9.0", features=("causal", "head_dim_differs"), head_dim=dqk,
                              head_dim_vo=dvo), assume_installed=True)
    assert candidate(d, "flash_attn:fa3").usable == fa3_ok
    assert {r.field for r in candidate(d, "flash_attn:fa2").reasons} == {"feature"}


@pytest.mark.parametrize("feature", ["fp8_kv", "sinks", "custom_mask"])
def test_undeclared_features(feature, fa3_package):
    d = select(ragged_problem("9.0", features=("causal", feature)), assume_installed=True)
    for name in ("flash_attn:fa3", "flash_attn:fa2"):
        assert {(r.field, r.actual) for r in candidate(d, name).reasons} == {("feature", feature)}


def paged_problem(sm, *, page_size=16, layout="NHD", dtype="bfloat16",
                  features=("causal", "gqa", "lse")):
    shape = {"head_dim_qk": 128, "head_dim_vo": 128, "num_qo_heads": 32, "num_kv_heads": 8,
             "batch_size": 4, "max_qo_len": 4096, "max_kv_len": 4096, "total_qo_len": 16384,
             "page_size": page_size, "q_len_per_req": 0}
    return Problem.make("batch_prefill_paged", simulated(sm), dtypes={"q": dtype, "kv": dtype,
                        "o": dtype}, shape=shape, features=features, layout=layout)


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_records_per_sm(sm, layout, fa3_package):
    d = select(paged_problem(sm, layout=layout), assume_installed=True)
    fa3, fa2 = candidate(d, "flash_attn:fa3"), candidate(d, "flash_attn:fa2")
    assert fa3.usable == (sm == "9.0")
    assert fa2.usable == (sm is not None and sm != "7.5")
    for cand in (fa3, fa2):
        if not cand.usable:
            assert {r.field for r in cand.reasons} == {"device" if sm is None else "sm"}


@pytest.mark.parametrize("page_size, gathers, in_place", [
    (1, True, False), (16, True, False), (64, True, False), (128, False, False),
    (256, False, True), (384, False, False), (512, False, True)])
def test_paged_page_sizes(page_size, gathers, in_place, fa3_package):
    """Pages up to 64 are gathered (fa3, fa2); FA2 reads multiples of 256 in place."""
    d = select(paged_problem("9.0", page_size=page_size), assume_installed=True)
    for name, ok in (("flash_attn:fa3", gathers), ("flash_attn:fa2", gathers),
                     ("flash_attn:fa2_block_table", in_place)):
        cand = candidate(d, name)
        assert cand.usable == ok, name
        if not ok:
            assert {r.field for r in cand.reasons} == {"page_size"}


def test_paged_features_and_wheel(fa3_wheel_only):
    d = select(paged_problem("9.0", features=("causal", "soft_cap", "lse")), assume_installed=True)
    assert candidate(d, "flash_attn:fa3").usable
    d = select(paged_problem("9.0", dtype="float16"), assume_installed=True)
    assert [(r.field, r.actual) for r in candidate(d, "flash_attn:fa3").reasons] == [
        ("dtype.q", "float16")]
    for feature in ("window", "sinks", "custom_mask"):
        d = select(paged_problem("9.0", features=("causal", feature)), assume_installed=True)
        assert ("feature", feature) in {(r.field, r.actual)
                                        for r in candidate(d, "flash_attn:fa3").reasons}


def test_fa2_old_version_rejected(monkeypatch):
    import sys
    import types
    monkeypatch.setattr(fa, "import_error", lambda m: None)
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(__version__="2.5.9"))
    reasons = fa.fa2_reasons(ragged_problem("9.0"))
    assert [(r.field, r.actual) for r in reasons] == [("version", "2.5.9")]
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(__version__="2.8.3"))
    assert fa.fa2_reasons(ragged_problem("9.0")) == []


def test_adapter_imports_no_vendor_module():
    import sys
    assert "flash_attn_interface" not in sys.modules or HAS_CUDA
    assert "fa3_fwd_interface" not in sys.modules or HAS_CUDA


# --- GPU: the real modules vs float32 torch -------------------------------------------------

def _skip_unless_imports(variant):
    if variant == "fa3":
        if fa.fa3_module_name() is None:
            pytest.skip("neither flash_attn_interface nor fa3_fwd_interface imports")
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("FA3 needs SM 9.0")
    elif fa.import_error("flash_attn") is not None:
        pytest.skip(f"flash_attn does not import: {fa.import_error('flash_attn')}")


GPU_CASES = [
    ([1, 17, 128, 300], [1, 40, 128, 513], {"causal": True}),
    ([64, 33], [64, 200], {}),
    ([129, 7], [300, 7], {"causal": True, "soft_cap": 30.0}),
    ([200, 50], [100, 60], {"causal": True}),  # a request with more queries than keys
]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fa3", "fa2"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("qo_lens, kv_lens, kw", GPU_CASES)
def test_gpu_ragged(variant, head_dim, qo_lens, kv_lens, kw):
    _skip_unless_imports(variant)
    plan = make_plan(qo_lens, kv_lens, num_qo_heads=8, num_kv_heads=2, head_dim_qk=head_dim,
                     dtype=torch.bfloat16, device="cuda", **kw)
    q, k, v = ragged_inputs(plan, hnd=True)
    out, lse = run_planner(kernel_for("flash_attn", "batch_prefill_ragged", variant), plan, q, k, v,
                           scales=RunScales(q_scale=1.25, v_scale=0.5))
    want_out, want_lse = naive_batch(q.cpu().float(), k.cpu().float(), v.cpu().float(), qo_lens,
                                     kv_lens, sm_scale=plan.sm_scale, causal=plan.causal,
                                     soft_cap=plan.logits_soft_cap, q_scale=1.25, v_scale=0.5)
    assert rel_error(out.cpu(), want_out) < TOLERANCE[torch.bfloat16]
    assert_lse_close(lse.cpu(), want_lse.float(), TOLERANCE[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fa3", "fa2"])
def test_gpu_ragged_cuda_graph_replay(variant):
    _skip_unless_imports(variant)
    plan = make_plan([100, 3, 250], [300, 40, 250], num_qo_heads=8, num_kv_heads=2,
                     head_dim_qk=128, dtype=torch.bfloat16, device="cuda", causal=True,
                     cuda_graph=True)
    runner = kernel_for("flash_attn", "batch_prefill_ragged", variant)(plan)
    q, k, v = ragged_inputs(plan, seed=5)
    out = torch.empty(plan.total_qo, 8, 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(plan.total_qo, 8, device="cuda")
    graph = capture_cuda_graph(lambda: runner(q, KVInput(k, v), out, lse, RunScales()))
    for seed in (6, 7):
        q2, k2, v2 = ragged_inputs(plan, seed=seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        poison(out), poison(lse)
        graph.replay()
        eager_out, eager_lse = run_planner(kernel_for("flash_attn", "batch_prefill_ragged", variant),
                                           plan, q2, k2, v2)
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
        want, _ = naive_batch(q2.cpu().float(), k2.cpu().float(), v2.cpu().float(),
                              [100, 3, 250], [300, 40, 250], sm_scale=plan.sm_scale, causal=True)
        assert rel_error(out.cpu(), want) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fa3", "fa2"])
@pytest.mark.parametrize("op, qo_len", [("single_prefill", 77), ("single_decode", 1)])
def test_gpu_single(variant, op, qo_len):
    _skip_unless_imports(variant)
    torch.manual_seed(8)
    kv_len = 333
    q = torch.randn(qo_len, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(kv_len, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(kv_len, 2, 128, device="cuda", dtype=torch.bfloat16)
    params = AttentionParams(sm_scale=128 ** -0.5, causal=op == "single_prefill",
                             return_lse=True, o_dtype=torch.bfloat16)
    out, lse = kernel_for("flash_attn", op, variant)(q, k, v, params)
    want_out, want_lse = naive_batch(q.cpu().float(), k.cpu().float(), v.cpu().float(), [qo_len],
                                     [kv_len], sm_scale=params.sm_scale, causal=True)
    assert rel_error(out.cpu(), want_out) < TOLERANCE[torch.bfloat16]
    assert_lse_close(lse.cpu(), want_lse.float(), TOLERANCE[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fa3", "fa2"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("layout, split5d", [("NHD", False), ("HND", False), ("NHD", True)])
def test_gpu_paged(variant, page_size, layout, split5d):
    _skip_unless_imports(variant)
    qo_lens, kv_lens = [1, 17, 128, 300], [1, 40, 0, 513]
    plan, q, k_cache, v_cache, k, v = make_paged(
        qo_lens, kv_lens, page_size=page_size, layout=layout, split5d=split5d, num_qo_heads=8,
        num_kv_heads=2, head_dim_qk=128, dtype=torch.bfloat16, device="cuda", causal=True)
    out, lse = run_paged(variant, plan, q, k_cache, v_cache, scales=RunScales(q_scale=1.25))
    want_out, want_lse = naive_batch(q.cpu().float(), k.cpu().float(), v.cpu().float(), qo_lens,
                                     kv_lens, sm_scale=plan.sm_scale, causal=True, q_scale=1.25)
    assert rel_error(out.cpu(), want_out) < TOLERANCE[torch.bfloat16]
    assert_lse_close(lse.cpu(), want_lse.float(), TOLERANCE[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("layout, split5d", [("NHD", False), ("HND", False), ("NHD", True)])
@pytest.mark.parametrize("ids_on_host", [False, True])
def test_gpu_fa2_block_table(layout, split5d, ids_on_host):
    _skip_unless_imports("fa2")
    qo_lens, kv_lens = [1, 17, 128, 300], [1, 400, 0, 1030]
    plan, q, k_cache, v_cache, k, v = make_paged(
        qo_lens, kv_lens, page_size=256, layout=layout, split5d=split5d, num_qo_heads=8,
        num_kv_heads=2, head_dim_qk=128, dtype=torch.bfloat16, device="cuda", causal=True)
    if ids_on_host:
        plan = dataclasses.replace(plan, kv_indices_host=plan.kv_indices.cpu())
    out, lse = run_paged("fa2_block_table", plan, q, k_cache, v_cache,
                         scales=RunScales(q_scale=1.25))
    want_out, want_lse = naive_batch(q.cpu().float(), k.cpu().float(), v.cpu().float(), qo_lens,
                                     kv_lens, sm_scale=plan.sm_scale, causal=True, q_scale=1.25)
    assert rel_error(out.cpu(), want_out) < TOLERANCE[torch.bfloat16]
    assert_lse_close(lse.cpu(), want_lse.float(), TOLERANCE[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fa3", "fa2"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_gpu_paged_cuda_graph_replay(variant, layout):
    _skip_unless_imports(variant)
    qo_lens, kv_lens = [100, 3, 250], [300, 40, 250]
    kw = dict(page_size=16, layout=layout, num_qo_heads=8, num_kv_heads=2, head_dim_qk=128,
              dtype=torch.bfloat16, device="cuda", causal=True, cuda_graph=True)
    plan, q, k_cache, v_cache, _, _ = make_paged(qo_lens, kv_lens, **kw)
    runner = kernel_for("flash_attn", "batch_prefill_paged", variant)(plan)
    out = torch.empty(plan.total_qo, 8, 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(plan.total_qo, 8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        runner(q, KVInput(k_cache, v_cache), out, lse, RunScales())  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner(q, KVInput(k_cache, v_cache), out, lse, RunScales())
    for seed in (6, 7):  # same page table, fresh contents
        _, q2, kc2, vc2, k2, v2 = make_paged(qo_lens, kv_lens, seed=seed, **kw)
        q.copy_(q2), k_cache.copy_(kc2), v_cache.copy_(vc2)
        poison(out), poison(lse)
        graph.replay()
        want, _ = naive_batch(q2.cpu().float(), k2.cpu().float(), v2.cpu().float(), qo_lens,
                              kv_lens, sm_scale=plan.sm_scale, causal=True)
        assert rel_error(out.cpu(), want) < TOLERANCE[torch.bfloat16]


def test_fa3_leaves_the_reserved_sms_and_splits_few_long_rows(monkeypatch):
    """The raw FA3 op gets ``sm_margin`` from ``reserving_sms`` (0 outside it) and the split
    count it is given; ``key_splits`` cuts only few, long rows."""
    from flashinfer.device import reserving_sms

    seen = []

    def raw(*args):
        seen.append((args[-3], args[-1]))  # (num_splits, sm_margin)
        return (args[0].new_zeros(args[0].shape), None)
    monkeypatch.setattr(fa, "_fa3_forward_op", lambda: raw)
    q = torch.zeros(4, 2, 8)
    call = dict(scale=1.0, causal=False, window=(-1, -1), softcap=0.0)
    fa.fa3_varlen(q, q, q, None, None, 4, 4, **call)
    with reserving_sms(16):
        fa.fa3_varlen(q, q, q, None, None, 4, 4, num_splits=3, **call)
    fa.fa3_varlen(q, q, q, None, None, 4, 4, **call)
    assert seen == [(1, 0), (3, 16), (1, 0)]
    assert fa.key_splits(1, 32, 64, 32768, "cpu") == 1  # (CPU: never split)


@pytest.mark.parametrize("qo_lens,kv_lens,causal,want", [
    ([1, 2], [3, 5], False, False), ([1, 2], [0, 5], False, True), ([0, 2], [0, 5], False, False),
    ([4, 3], [6, 3], True, False), ([4, 3], [6, 2], True, True), ([4, 3], [6, 2], False, False)])
def test_empty_rows_are_known_at_plan(qo_lens, kv_lens, causal, want):
    """An eager plan skips the lse fix-up of rows that see no key only when it has none: a
    request of no keys, or a causal one of more query tokens than keys (bottom-right)."""
    from flashinfer.backends.flash_attn.attention import _has_empty_rows

    assert _has_empty_rows(make_plan(qo_lens, kv_lens, causal=causal)) is want
