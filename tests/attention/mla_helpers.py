"""Shared helpers of the MLA tests: a random ragged case over a shuffled page table, the float64
naive MLA of the contract, a planned wrapper, the lse comparison."""

from __future__ import annotations

import math

import torch

import flashinfer
from conftest import rel_error

I32 = torch.int32
E4M3 = torch.float8_e4m3fn


def _ws(device="cpu"):
    return torch.empty(1 << 20, dtype=torch.uint8, device=device)


def _case(qo_lens, kv_lens, *, page_size=4, heads=4, ckv=32, kpe=8, spare=3, seed=0):
    """Host index arrays over a shuffled page table, and the caches / queries (float32)."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // page_size) for n in kv_lens]
    total = sum(pages) + spare
    perm = torch.randperm(total, generator=g).to(I32)
    kv_indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=I32)
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=I32)
    arrays = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=perm[:sum(pages)].clone(),
                  kv_len_arr=torch.tensor(kv_lens, dtype=I32))
    tensors = dict(q_nope=torch.randn(sum(qo_lens), heads, ckv, generator=g),
                   q_pe=torch.randn(sum(qo_lens), heads, kpe, generator=g),
                   ckv_cache=torch.randn(total, page_size, ckv, generator=g),
                   kpe_cache=torch.randn(total, page_size, kpe, generator=g))
    return arrays, tensors


def naive(arrays, tensors, page_size, causal, sm_scale, ckv_scale=1.0, kpe_scale=1.0):
    """float64 (out, lse base 2) of the MLA contract, token by token from the page table."""
    qo, kvp = arrays["qo_indptr"].tolist(), arrays["kv_indptr"].tolist()
    ids, lens = arrays["kv_indices"].tolist(), arrays["kv_len_arr"].tolist()
    qn, qp = tensors["q_nope"].double(), tensors["q_pe"].double()
    ckv_c, kpe_c = tensors["ckv_cache"].double(), tensors["kpe_cache"].double()
    heads, dckv = qn.shape[1], qn.shape[2]
    out = torch.zeros(qn.shape[0], heads, dckv, dtype=torch.float64)
    lse = torch.full((qn.shape[0], heads), -math.inf, dtype=torch.float64)
    for b in range(len(lens)):
        q_len, kv_len = qo[b + 1] - qo[b], lens[b]
        tok = [(ids[kvp[b] + t // page_size], t % page_size) for t in range(kv_len)]
        if not tok:
            continue
        ckv = torch.stack([ckv_c[p, s] for p, s in tok]) * ckv_scale
        kpe = torch.stack([kpe_c[p, s] for p, s in tok]) * kpe_scale
        for i in range(q_len):
            r = qo[b] + i
            s = (qn[r] @ ckv.T + qp[r] @ kpe.T) * sm_scale  # [H, kv_len]
            if causal:
                s[:, kv_len - q_len + i + 1:] = -math.inf
            if torch.isinf(s).all():
                continue
            lse[r] = torch.logsumexp(s, -1) / math.log(2.0)
            out[r] = torch.softmax(s, -1) @ ckv
    return out, lse


def _plan(arrays, page_size, causal, sm_scale=0.17, dtype=torch.float32, kv_dtype=None,
          heads=4, ckv=32, kpe=8, device="cpu", backend="auto", **ctor):
    w = flashinfer.BatchMLAPagedAttentionWrapper(_ws(device), backend=backend, **ctor)
    w.plan(*(arrays[k].to(device) for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")),
           heads, ckv, kpe, page_size, causal, sm_scale, dtype, kv_dtype or dtype)
    return w


def _assert_lse(got, want):
    """``-inf`` exactly where ``want`` has it (rows that see no key), close elsewhere."""
    empty = torch.isneginf(want)
    assert torch.equal(torch.isneginf(got), empty)
    assert rel_error(got[~empty], want[~empty]) < 1e-5
