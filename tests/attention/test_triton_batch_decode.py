"""Triton split-K paged decode planner (flashinfer/backends/triton/batch_attention.py).

The planner is driven directly through BatchPlan objects built here from python lists, and
compared with a float64 oracle written in this file. CPU runs use TRITON_INTERPRET=1 (conftest)
at small shapes; GPU tests use realistic sizes and CUDA-graph capture.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import HAS_CUDA, TOLERANCE, poison, rel_error
from flashinfer import device as fdevice
from flashinfer.attention.batch_params import BatchPlan, KVInput, RunScales
from flashinfer.attention.params import get_alibi_slopes
from flashinfer.capability_db import database
from flashinfer.dispatch import Problem
from flashinfer.dispatch import adapter_reasons
from flashinfer.backends.triton import batch_attention as bd

DEV = "cuda:0" if HAS_CUDA else "cpu"  # indexed, as a wrapper's plan.device (its workspace's)


# --- helpers ---------------------------------------------------------------------------------

def make_case(kv_lens, *, page_size=4, hq=4, hkv=2, d=32, dvo=None, layout="NHD", q_len=1,
              dtype=torch.float16, kv_dtype=None, o_dtype=None, window_left=-1, soft_cap=0.0,
              causal=False, device=DEV, cuda_graph=False, workspace=None, spare_pages=3,
              pos_encoding_mode="NONE"):
    """A BatchPlan over a randomly permuted page table, plus q and the (k, v) cache views."""
    dvo = d if dvo is None else dvo
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    batch = len(kv_lens)
    pages_per = [max(1, math.ceil(n / page_size)) if n > 0 else 0 for n in kv_lens]
    total_pages = sum(pages_per) + spare_pages
    perm = torch.randperm(total_pages, dtype=torch.int32)
    indptr = [0]
    for n in pages_per:
        indptr.append(indptr[-1] + n)
    indices = perm[:indptr[-1]]
    last = [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages_per)]
    qo_indptr = [b * q_len for b in range(batch + 1)]
    total_qo = batch * q_len

    def cache(dim):
        shape = ((total_pages, page_size, hkv, dim) if layout == "NHD"
                 else (total_pages, hkv, page_size, dim))
        return torch.randn(shape, device=device).to(kv_dtype)

    k_cache, v_cache = cache(d), cache(dvo)
    q = torch.randn(total_qo, hq, d, device=device).to(dtype)
    i32 = dict(dtype=torch.int32)
    host = {"qo": torch.tensor(qo_indptr, **i32), "kv": torch.tensor(indptr, **i32),
            "lens": torch.tensor(kv_lens, **i32), "last": torch.tensor(last, **i32)}
    plan = BatchPlan(
        op="batch_decode", device=torch.device(device), batch_size=batch, num_qo_heads=hq,
        num_kv_heads=hkv, head_dim_qk=d, head_dim_vo=dvo, page_size=page_size, kv_layout=layout,
        q_dtype=dtype, kv_dtype=kv_dtype, o_dtype=o_dtype or dtype, causal=causal,
        window_left=window_left, logits_soft_cap=soft_cap, sm_scale=1.0 / math.sqrt(d),
        q_len_per_req=q_len, qo_indptr_host=host["qo"], kv_indptr_host=host["kv"],
        kv_lens_host=host["lens"], kv_last_page_len_host=host["last"],
        qo_indptr=host["qo"].to(device), kv_indptr=host["kv"].to(device),
        kv_indices=indices.to(device), kv_lens=host["lens"].to(device),
        kv_last_page_len=host["last"].to(device), total_qo=total_qo, max_qo_len=q_len,
        max_kv_len=max(kv_lens), cuda_graph=cuda_graph, workspace=workspace,
        pos_encoding_mode=pos_encoding_mode)
    return plan, q, k_cache, v_cache


def oracle(plan, q, k_cache, v_cache, scales=RunScales()):
    """float64 (out, lse base 2) from the plan's host arrays."""
    if plan.kv_layout == "HND":
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    group = plan.num_qo_heads // plan.num_kv_heads
    indices = plan.kv_indices.cpu().long()
    out = torch.zeros(plan.total_qo, plan.num_qo_heads, plan.head_dim_vo, dtype=torch.float64)
    lse = torch.full((plan.total_qo, plan.num_qo_heads), -math.inf, dtype=torch.float64)
    scale = plan.sm_scale * scales.q_scale * scales.k_scale
    for b in range(plan.batch_size):
        n = int(plan.kv_lens_host[b])
        q0, q1 = int(plan.qo_indptr_host[b]), int(plan.qo_indptr_host[b + 1])
        pages = indices[int(plan.kv_indptr_host[b]):int(plan.kv_indptr_host[b + 1])]
        k = k_cache[pages.to(k_cache.device)].double().cpu().reshape(-1, plan.num_kv_heads, plan.head_dim_qk)[:n]
        v = v_cache[pages.to(v_cache.device)].double().cpu().reshape(-1, plan.num_kv_heads, plan.head_dim_vo)[:n]
        k = k.repeat_interleave(group, 1)
        v = v.repeat_interleave(group, 1) * scales.v_scale
        qb = q[q0:q1].double().cpu()
        s = torch.einsum("qhd,khd->hqk", qb, k) * scale
        if plan.pos_encoding_mode == "ALIBI":  # slope * (key - query row in the request)
            slopes = get_alibi_slopes(plan.num_qo_heads).double()[:, None, None]
            s = s + slopes * (torch.arange(n)[None, :] - torch.arange(q1 - q0)[:, None])
        if plan.logits_soft_cap > 0:
            s = plan.logits_soft_cap * torch.tanh(s / plan.logits_soft_cap)
        pos = n - (q1 - q0) + torch.arange(q1 - q0)
        keys = torch.arange(n)
        vis = keys[None, :] <= pos[:, None]
        if plan.window_left >= 0:
            vis &= keys[None, :] >= pos[:, None] - plan.window_left
        s = s.masked_fill(~vis[None], -math.inf)
        if n == 0:
            continue
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = torch.exp(s - m)
        denom = e.sum(-1, keepdim=True)
        lse[q0:q1] = (torch.log(denom) + m).squeeze(-1).T / math.log(2)
        if scales.sinks is not None:
            sink = scales.sinks.double().cpu()[:, None, None]
            denom = denom + torch.exp(sink - m)
        p = torch.where(e.sum(-1, keepdim=True) > 0, e / denom, torch.zeros_like(e))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, v)
    return out, lse


def run(plan, q, k_cache, v_cache, scales=RunScales(), num_splits=None, want_lse=True):
    runner = bd.make_runner(plan, num_splits)
    out = poison(torch.empty(plan.total_qo, plan.num_qo_heads, plan.head_dim_vo,
                             dtype=plan.o_dtype, device=plan.device))
    lse = poison(torch.empty(plan.total_qo, plan.num_qo_heads, dtype=torch.float32,
                             device=plan.device)) if want_lse else None
    runner(q, KVInput(k_cache, v_cache), out, lse, scales)
    return out, lse


def check(plan, q, k_cache, v_cache, scales=RunScales(), num_splits=None, tol=None):
    out, lse = run(plan, q, k_cache, v_cache, scales, num_splits)
    ref_out, ref_lse = oracle(plan, q, k_cache, v_cache, scales)
    tol = tol or TOLERANCE[plan.q_dtype]
    assert rel_error(out.cpu(), ref_out) < tol
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert torch.allclose(lse.cpu().double()[finite], ref_lse[finite], atol=2e-2, rtol=1e-3)
    return out, lse


# --- CPU (interpreter) correctness -------------------------------------------------------------

@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("splits", [1, 3])
def test_ragged_batch_layouts_and_splits(layout, splits):
    torch.manual_seed(0)
    # kv_len 1, page boundary -1 / exact / +1 (page 4), a longer one
    case = make_case([1, 3, 4, 5, 37], layout=layout)
    check(*case, num_splits=splits)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (8, 2), (8, 1)])
def test_page_sizes_and_gqa_groups(page_size, hq, hkv):
    torch.manual_seed(1)
    case = make_case([1, page_size + 1, 2 * page_size - 1, 40], page_size=page_size, hq=hq,
                     hkv=hkv, dtype=torch.bfloat16)
    check(*case, num_splits=2)


def test_window_soft_cap_and_sinks():
    torch.manual_seed(2)
    plan, q, k, v = make_case([1, 9, 70], window_left=7, soft_cap=5.0, layout="HND")
    sinks = torch.randn(plan.num_qo_heads, device=plan.device)
    check(plan, q, k, v, RunScales(sinks=sinks), num_splits=4)


@pytest.mark.parametrize("extra", [{}, {"soft_cap": 4.0, "q_len": 2, "window_left": 9}])
def test_alibi(extra):
    """ALiBi's bias inside the kernel, alone and with a cap, multi-query rows and a window."""
    torch.manual_seed(12)
    plan, q, k, v = make_case([1, 17, 45], hq=8, hkv=2, pos_encoding_mode="ALIBI", **extra)
    check(plan, q, k, v, num_splits=3)


def test_scales_and_fp32_out():
    torch.manual_seed(3)
    plan, q, k, v = make_case([6, 33], o_dtype=torch.float32)
    check(plan, q, k, v, RunScales(q_scale=0.5, k_scale=2.0, v_scale=0.25), num_splits=2)


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_kv(kv_dtype):
    torch.manual_seed(4)
    plan, q, k, v = make_case([5, 30], kv_dtype=kv_dtype, dtype=torch.bfloat16)
    check(plan, q, k, v, RunScales(k_scale=0.7, v_scale=1.3), num_splits=2)


def test_multi_query_causal_inside_request():
    torch.manual_seed(5)
    # q_len 3 with kv_len 2: the first query row sees no key -> out 0, lse -inf
    plan, q, k, v = make_case([2, 8, 21], q_len=3, hq=8, hkv=2)
    out, lse = check(plan, q, k, v, num_splits=2)
    assert torch.all(out[0].float() == 0) and torch.all(torch.isinf(lse[0]))


def test_window_with_multi_query_and_empty_request():
    torch.manual_seed(6)
    plan, q, k, v = make_case([0, 12, 30], q_len=2, window_left=3)
    out, lse = check(plan, q, k, v, num_splits=3)
    assert torch.all(out[:2].float() == 0) and torch.all(torch.isneginf(lse[:2]))


def test_head_dim_differs_and_no_lse():
    torch.manual_seed(7)
    plan, q, k, v = make_case([7, 19], d=64, dvo=24)
    out, lse = run(plan, q, k, v, num_splits=2, want_lse=False)
    assert lse is None
    assert rel_error(out.cpu(), oracle(plan, q, k, v)[0]) < TOLERANCE[torch.float16]


# --- planner decisions -----------------------------------------------------------------------

def test_split_count_fills_the_gpu():
    plan = make_case([4096] * 2, hq=4, hkv=2, device="cpu")[0]
    cfg = bd.launch_config(plan)
    assert cfg.num_splits == 16  # 4 programs * 16 splits >= 2 * 132 SMs / 4, capped by 4096 / 256
    short = make_case([40, 3], device="cpu")[0]
    assert bd.launch_config(short).num_splits == 1
    graph = make_case([40, 3], device="cpu", cuda_graph=True)[0]
    assert bd.launch_config(graph).num_splits == bd.MAX_SPLITS  # lengths may grow on replay
    assert bd.launch_config(plan, num_splits=500).num_splits == bd.MAX_SPLITS


def test_workspace_carved_or_too_small():
    torch.manual_seed(8)
    plan, q, k, v = make_case([5, 17])
    need = bd.scratch_bytes(plan, 2)
    ws = torch.empty(need + bd.ALIGN, dtype=torch.uint8, device=plan.device)
    planw = make_case([5, 17], workspace=ws)[0]
    runner = bd.make_runner(planw, 2)
    start = runner.part_o.data_ptr()
    assert start % bd.ALIGN == 0 and ws.data_ptr() <= start < ws.data_ptr() + bd.ALIGN
    check(planw, *make_case([5, 17])[1:], num_splits=2)
    small = make_case([5, 17], workspace=torch.empty(need - 1, dtype=torch.uint8, device=DEV))[0]
    with pytest.raises(ValueError, match="workspace too small.*needs [0-9]+ bytes"):
        bd.make_runner(small, 2)
    wrong = make_case([5, 17], workspace=torch.empty(need, dtype=torch.float32, device=DEV))[0]
    with pytest.raises(ValueError, match="workspace must be a contiguous byte buffer"):
        bd.make_runner(wrong, 2)


def test_registered_planner_returns_runner():
    from flashinfer.dispatch import kernel_for

    torch.manual_seed(9)
    plan, q, k, v = make_case([3, 10])
    runner = kernel_for("triton", "batch_decode", "default")(plan)
    out = poison(torch.empty_like(q))
    runner(q, KVInput(k, v), out, None, RunScales())
    assert rel_error(out.cpu(), oracle(plan, q, k, v)[0]) < TOLERANCE[torch.float16]


def _problem(sm, kv="bfloat16", features=("gqa",), page_size=16, head_dim=128):
    where = fdevice.simulated(sm)
    return Problem.make("batch_decode", where, dtypes={"q": "bfloat16", "kv": kv, "o": "bfloat16"},
                        shape={"head_dim_qk": head_dim, "head_dim_vo": head_dim,
                               "page_size": page_size, "num_qo_heads": 32, "num_kv_heads": 8},
                        features=features, layout="NHD")


def _reasons(problem):
    (record,) = database().for_backend_op("triton", "batch_decode")
    return record.check(problem, assume_installed=True) + adapter_reasons(
        "triton", "batch_decode", "default", problem)


@pytest.mark.parametrize("sm", ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"])
def test_record_on_simulated_devices(sm):
    reasons = _reasons(_problem(sm))
    if sm == "7.5":
        assert [r.field for r in reasons] == ["sm"]
    elif sm == "cpu":
        assert [r.field for r in reasons] == ["device"]
    else:
        assert reasons == []
    (record,) = database().for_backend_op("triton", "batch_decode")
    assert record.check(_problem("cpu"), assume_installed=True, triton_interpret=True) == []


@pytest.mark.parametrize("sm,ok", [("8.0", False), ("8.6", False), ("8.9", True), ("9.0", True)])
def test_fp8_kv_needs_sm89(sm, ok):
    reasons = _reasons(_problem(sm, kv="float8_e4m3fn", features=("gqa", "fp8_kv")))
    assert (reasons == []) == ok
    if not ok:
        assert reasons[0].field == "sm" and "fp8" in reasons[0].message


def test_record_rejects_big_pages_and_head_dims():
    fields = {r.field for r in _reasons(_problem("9.0", page_size=128, head_dim=512))}
    assert fields == {"page_size", "head_dim_qk", "head_dim_vo"}


# --- GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_gpu_realistic_vs_float32(dtype, layout):
    torch.manual_seed(10)
    lens = torch.randint(1, 4097, (64,)).tolist()
    lens[0], lens[1] = 4096, 1
    plan, q, k, v = make_case(lens, page_size=16, hq=32, hkv=8, d=128, dtype=dtype, layout=layout)
    out, lse = run(plan, q, k, v)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(1, 2), v.transpose(1, 2))
    ref = torch.empty(plan.total_qo, 32, 128, device="cuda")
    for b, n in enumerate(lens):
        pages = plan.kv_indices[plan.kv_indptr_host[b]:plan.kv_indptr_host[b + 1]].long()
        kb = kk[pages].reshape(-1, 8, 128)[:n].float().repeat_interleave(4, 1)
        vb = vv[pages].reshape(-1, 8, 128)[:n].float().repeat_interleave(4, 1)
        s = torch.einsum("hd,khd->hk", q[b].float(), kb) * plan.sm_scale
        ref[b] = torch.einsum("hk,khd->hd", s.softmax(-1), vb)
    assert rel_error(out, ref) < TOLERANCE[dtype]


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_matches_eager():
    torch.manual_seed(11)
    lens = [300, 1, 17, 2048]
    plan, q, k, v = make_case(lens, page_size=16, hq=32, hkv=8, d=128, dtype=torch.bfloat16,
                              cuda_graph=True, spare_pages=200)
    runner = bd.make_runner(plan)
    out = torch.empty(plan.total_qo, 32, 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(plan.total_qo, 32, device="cuda")
    runner(q, KVInput(k, v), out, lse, RunScales())  # warm-up (compiles)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner(q, KVInput(k, v), out, lse, RunScales())
    # new contents in the same buffers: cache, queries, lengths and page table
    k.copy_(torch.randn_like(k, dtype=torch.float32))
    v.copy_(torch.randn_like(v, dtype=torch.float32))
    q.copy_(torch.randn_like(q, dtype=torch.float32))
    new = make_case([5, 2000, 64, 1], page_size=16, hq=32, hkv=8, d=128, dtype=torch.bfloat16,
                    spare_pages=0)[0]
    assert new.kv_indices.numel() <= plan.kv_indices.numel()
    plan.kv_indptr.copy_(new.kv_indptr)
    plan.kv_indices[:new.kv_indices.numel()].copy_(new.kv_indices)
    plan.kv_lens.copy_(new.kv_lens)
    graph.replay()
    torch.cuda.synchronize()
    eager_plan = make_case([5, 2000, 64, 1], page_size=16, hq=32, hkv=8, d=128,
                           dtype=torch.bfloat16)[0]
    eager_plan = BatchPlan(**{**eager_plan.__dict__, "kv_indices": plan.kv_indices,
                              "kv_indptr": plan.kv_indptr, "kv_lens": plan.kv_lens})
    eager_out, eager_lse = run(eager_plan, q, k, v, num_splits=runner.config.num_splits)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    assert rel_error(out, oracle(eager_plan, q, k, v)[0].cuda()) < TOLERANCE[torch.bfloat16]
