"""Helpers shared by the attention tests.

* random paged KV caches for the batch wrappers (``make_paged``) and their workspace (``ws``),
  from test_batch_attention_reference.py;
* the flash_attn / torch ragged-planner tests' machinery, from test_flash_attn.py: a float64
  emulation of FlashAttention's varlen forward (``emulated_varlen``), the batch contract in naive
  float64 (``naive_batch``), a hand-built ragged-prefill BatchPlan (``make_plan``) with its inputs
  (``ragged_inputs``) and runner (``run_planner``), the lse comparison (``assert_lse_close``), and
  the decision helpers on simulated SMs (``SMS``, ``ragged_problem``, ``candidate``).
"""

import math

import pytest

import torch

from conftest import poison, rel_error
from flashinfer.attention.batch_params import BatchPlan, KVInput, RunScales
from flashinfer.device import simulated
from flashinfer.dispatch import Problem
from flashinfer.page import unpack_paged_kv_cache


# --- paged caches for the batch wrappers -----------------------------------------------------

def make_paged(kv_lens, page_size, hk, d, layout, dtype=torch.float32, dv=None, spare=3):
    """Random paged cache with shuffled pages; returns cache 5-D, indptr, indices, last, ks, vs."""
    dv = dv or d
    pages_per = [max(1, -(-n // page_size)) if n else 0 for n in kv_lens]
    total = sum(pages_per) + spare
    perm = torch.randperm(total).to(torch.int32)
    shape = (total, 2, page_size, hk, d) if layout == "NHD" else (total, 2, hk, page_size, d)
    cache = torch.randn(shape).to(dtype)
    indptr = torch.tensor([0] + list(torch.tensor(pages_per).cumsum(0).tolist()), dtype=torch.int32)
    indices = perm[:sum(pages_per)].contiguous()
    last = torch.tensor([(n - 1) % page_size + 1 if n else 0 for n in kv_lens], dtype=torch.int32)
    k_cache, v_cache = unpack_paged_kv_cache(cache, layout)
    ks, vs = [], []
    for b, n in enumerate(kv_lens):
        ids = indices[indptr[b]:indptr[b + 1]].long()
        kb, vb = k_cache[ids], v_cache[ids]
        if layout == "HND":
            kb, vb = kb.transpose(1, 2), vb.transpose(1, 2)
        ks.append(kb.reshape(-1, hk, d)[:n])
        vs.append(vb.reshape(-1, hk, d)[:n])
    return cache, indptr, indices, last, ks, vs


def ws():
    """A 1 MiB workspace buffer for a batch wrapper."""
    return torch.empty(1 << 20, dtype=torch.uint8)


# --- emulation of FlashAttention's varlen forward --------------------------------------------

@pytest.fixture(name="calls")
def emulated_fa_calls(monkeypatch):
    """``calls``: FA3's and FA2's vendor entry points replaced by :func:`emulated_varlen`, the
    list of their calls' arguments (import this fixture into a test module to use it)."""
    from flashinfer.backends.flash_attn import attention as fa

    log = []

    def fake(*args, **kwargs):
        return emulated_varlen(*args, calls=log, **kwargs)
    monkeypatch.setattr(fa, "fa3_varlen", fake)
    monkeypatch.setattr(fa, "fa2_varlen", fake)
    return log


def emulated_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, causal, window, softcap,
                    calls=None, out=None, block_table=None, num_splits=1, qv=None):
    """FA2/FA3 ``flash_attn_varlen_func`` in float64 (mask.h semantics; ``num_splits``, FA3's
    key chunks, changes nothing exact; FA3's ``qv [total_q, H, Dv]`` adds ``qv . v`` to the
    scores); like FA3's compiled op, a given ``out`` is written and returned; like FA2's, with ``block_table`` ``k`` / ``v``
    are paged caches ``[pages, page_size, H, D]`` whose pages of multiples of 256 slots it reads
    through the table."""
    if block_table is not None:
        assert block_table.dtype == torch.int32 and block_table.stride(-1) == 1
        assert k.dim() == 4 and k.shape[1] % 256 == 0 and k.stride(-1) == 1
        if calls is not None:
            calls.append({"block_table": block_table, "k_cache": k, "v_cache": v})
        lens = (cu_k[1:] - cu_k[:-1]).tolist()
        assert max(lens, default=0) <= block_table.shape[1] * k.shape[1]
        rows = [cache[block_table[b].long()].flatten(0, 1)[:n]
                for cache in (k, v) for b, n in enumerate(lens)]
        k, v = torch.cat(rows[:len(lens)]), torch.cat(rows[len(lens):])
        result, lse = emulated_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale,
                                      causal=causal, window=window, softcap=softcap, calls=calls,
                                      out=out)
        for b, n in enumerate(lens):  # like FA2's split-KV kernel: a finite lse for no key
            if n == 0:
                lse[:, int(cu_q[b]):int(cu_q[b + 1])] = 0.0
        return result, lse
    if out is not None:
        result, lse = emulated_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale,
                                      causal=causal, window=window, softcap=softcap, calls=calls,
                                      qv=qv)
        out.copy_(result)
        return out, lse
    for t in (q, k, v):
        assert t.dim() == 3 and t.stride(-1) == 1
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
    assert cu_q.device == q.device and cu_k.device == q.device
    assert isinstance(max_q, int) and isinstance(max_k, int)
    if calls is not None:
        calls.append({"cu_q": cu_q, "cu_k": cu_k, "max_q": max_q, "max_k": max_k, "k": k, "v": v,
                      "scale": scale, "causal": causal, "window": window, "softcap": softcap})
    left, right = window
    if causal:
        right = 0
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"), dtype=torch.float64)
    for b in range(cu_q.numel() - 1):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        k0, k1 = int(cu_k[b]), int(cu_k[b + 1])
        assert q1 - q0 <= max_q and k1 - k0 <= max_k
        m, n = q1 - q0, k1 - k0
        if m == 0 or n == 0:
            continue
        i = torch.arange(m)[:, None] + n - m
        j = torch.arange(n)[None, :]
        keep = torch.ones(m, n, dtype=torch.bool)
        if causal:
            keep &= j <= i
        if left >= 0:  # a local window's missing right edge is max_seqlen_k
            keep &= (j >= i - left) & (j <= i + (right if right >= 0 else max_k))
        kk = k[k0:k1].double().repeat_interleave(group, 1)
        vv = v[k0:k1].double().repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].double(), kk)
        if qv is not None:
            s = s + torch.einsum("qhd,khd->hqk", qv[q0:q1].double(), vv)
        s = s * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~keep, float("-inf"))
        row_lse = torch.logsumexp(s, -1)
        p = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, vv)
        lse[:, q0:q1] = row_lse.masked_fill(torch.isneginf(row_lse), float("inf"))
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    return out.to(out_dtype), lse.float()


# --- the batch contract, naive float64 ------------------------------------------------------

def naive_batch(q, k, v, qo_lens, kv_lens, *, sm_scale, causal=False, window_left=-1,
                soft_cap=0.0, q_scale=1.0, k_scale=1.0, v_scale=1.0):
    """``(out [total_q, H, Dv], lse [total_q, H] base 2)`` per batch_attention_params.py."""
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    q0 = k0 = 0
    for m, n in zip(qo_lens, kv_lens):
        qb = q[q0:q0 + m].double()
        kb = k[k0:k0 + n].double().repeat_interleave(group, 1) * k_scale
        vb = v[k0:k0 + n].double().repeat_interleave(group, 1) * v_scale
        s = torch.einsum("qhd,khd->hqk", qb * q_scale, kb) * sm_scale
        if soft_cap > 0:
            s = soft_cap * torch.tanh(s / soft_cap)
        i = torch.arange(m)[:, None] + n - m
        j = torch.arange(n)[None, :]
        keep = torch.ones(m, n, dtype=torch.bool)
        if causal:
            keep &= j <= i
        if window_left >= 0:
            keep &= j >= i - window_left
        s = s.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        outs.append(torch.einsum("hqk,khd->qhd", p, vb))
        lses.append((lse / math.log(2.0)).t())
        q0, k0 = q0 + m, k0 + n
    return torch.cat(outs), torch.cat(lses)


def make_plan(qo_lens, kv_lens, *, num_qo_heads=4, num_kv_heads=2, head_dim_qk=32,
              head_dim_vo=None, dtype=torch.float32, o_dtype=None, causal=False, window_left=-1,
              soft_cap=0.0, sm_scale=None, device="cpu", cuda_graph=False) -> BatchPlan:
    """A ragged-prefill BatchPlan built by hand (what a wrapper's plan() would fix)."""
    device = torch.device(device)
    head_dim_vo = head_dim_vo or head_dim_qk
    qo_indptr = torch.tensor([0] + list(qo_lens), dtype=torch.int32).cumsum(0).to(torch.int32)
    kv_indptr = torch.tensor([0] + list(kv_lens), dtype=torch.int32).cumsum(0).to(torch.int32)
    kv_lens_host = torch.tensor(list(kv_lens), dtype=torch.int32)
    return BatchPlan(
        op="batch_prefill_ragged", device=device, batch_size=len(qo_lens),
        num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
        head_dim_vo=head_dim_vo, page_size=0, kv_layout="NHD", q_dtype=dtype, kv_dtype=dtype,
        o_dtype=o_dtype or dtype, causal=causal, window_left=window_left,
        logits_soft_cap=soft_cap, sm_scale=sm_scale or head_dim_qk ** -0.5, q_len_per_req=0,
        qo_indptr_host=qo_indptr, kv_indptr_host=kv_indptr, kv_lens_host=kv_lens_host,
        kv_last_page_len_host=None, qo_indptr=qo_indptr.to(device), kv_indptr=kv_indptr.to(device),
        kv_indices=None, kv_lens=kv_lens_host.to(device), kv_last_page_len=None,
        total_qo=int(sum(qo_lens)), max_qo_len=max(qo_lens), max_kv_len=max(kv_lens),
        cuda_graph=cuda_graph)


def ragged_inputs(plan, *, hnd=False, seed=0):
    """Random ``q, k, v`` for ``plan``, seeded; ``hnd``: K and V arrive as transposed views."""
    torch.manual_seed(seed)
    dev, dt = plan.device, plan.q_dtype
    total_kv = int(plan.kv_indptr_host[-1])
    q = torch.randn(plan.total_qo, plan.num_qo_heads, plan.head_dim_qk, device=dev).to(dt)
    if hnd:  # HND input arrives as a transposed view
        k = torch.randn(plan.num_kv_heads, total_kv, plan.head_dim_qk, device=dev).to(dt).transpose(0, 1)
        v = torch.randn(plan.num_kv_heads, total_kv, plan.head_dim_vo, device=dev).to(dt).transpose(0, 1)
    else:
        k = torch.randn(total_kv, plan.num_kv_heads, plan.head_dim_qk, device=dev).to(dt)
        v = torch.randn(total_kv, plan.num_kv_heads, plan.head_dim_vo, device=dev).to(dt)
    return q, k, v


def run_planner(planner, plan, q, k, v, *, lse=True, scales=RunScales()):
    """``planner(plan)`` run into NaN-filled ``out`` and (``lse``) ``lse`` buffers: both returned."""
    out = poison(torch.empty(plan.total_qo, plan.num_qo_heads, plan.head_dim_vo,
                             dtype=plan.o_dtype, device=plan.device))
    lse_buf = poison(torch.empty(plan.total_qo, plan.num_qo_heads, device=plan.device)) if lse else None
    planner(plan)(q, KVInput(k, v), out, lse_buf, scales)
    return out, lse_buf


def assert_lse_close(actual, expected, tol):
    """``-inf`` exactly where ``expected`` has it, within ``tol`` elsewhere."""
    empty = torch.isneginf(expected)
    assert torch.equal(torch.isneginf(actual), empty)
    assert rel_error(actual[~empty], expected[~empty]) < tol


# --- decisions on simulated SMs -------------------------------------------------------------

#: the SMs the decision tests simulate (None: the CPU)
SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", None]


def ragged_problem(sm, dtype="bfloat16", features=("causal", "gqa", "lse"), head_dim=128,
                   head_dim_vo=None, op="batch_prefill_ragged"):
    """A Problem of ``op`` (batch_prefill_ragged, or a batch or single attention op) at serving
    shapes on simulated SM ``sm``."""
    shape = {"head_dim_qk": head_dim, "head_dim_vo": head_dim_vo or head_dim,
             "num_qo_heads": 32, "num_kv_heads": 8}
    if op.startswith("batch"):
        shape.update(batch_size=4, max_qo_len=4096, max_kv_len=4096, total_qo_len=16384,
                     page_size=0 if op == "batch_prefill_ragged" else 16, q_len_per_req=0)
    else:
        shape.update(qo_len=1 if op == "single_decode" else 64, kv_len=1024)
    return Problem.make(op, simulated(sm), dtypes={"q": dtype, "kv": dtype, "o": dtype},
                        shape=shape, features=features, layout="NHD")


def candidate(decision, name):
    """The candidate of ``decision`` named ``name``."""
    return next(c for c in decision.candidates if c.name == name)
