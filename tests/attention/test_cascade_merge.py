"""Attention state merging (flashinfer/attention/merge.py, flashinfer.triton.cascade): the reference and
the Triton kernels (Triton's interpreter on the CPU, natively on a GPU) against float64 naive
math; empty states, masks, in-place updates, strided inputs, a head count x head dim past
upstream's 1,024-thread limit; attention over split keys merged equals attention over all of
them; bad input refused."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import HAS_CUDA, poison, rel_error
import flashinfer
import flashinfer.triton

DEV = "cuda:0" if HAS_CUDA else "cpu"
BACKENDS = ["reference", "triton"]


def naive(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 merge of ``v [rows, n, H, D]``, ``s [rows, n, H]`` (empty: 0 and -inf)."""
    v, s = v.double(), s.double()
    out = torch.zeros(v.shape[0], *v.shape[2:], dtype=torch.float64)
    lse = torch.full((v.shape[0], v.shape[2]), -math.inf, dtype=torch.float64)
    for r in range(v.shape[0]):
        for h in range(v.shape[2]):
            finite = [i for i in range(v.shape[1]) if s[r, i, h] != -math.inf]
            if not finite:
                continue
            top = max(float(s[r, i, h]) for i in finite)
            w = [2.0 ** (float(s[r, i, h]) - top) for i in finite]
            out[r, h] = sum(wi * v[r, i, h] for wi, i in zip(w, finite)) / sum(w)
            lse[r, h] = top + math.log2(sum(w))
    return out, lse


def _states(rows, n, heads, dim, seed, dtype=torch.float16, empty=()):
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(rows, n, heads, dim, generator=gen).to(dtype)
    s = torch.randn(rows, n, heads, generator=gen) * 4
    for r, i, h in empty:
        s[r, i, h] = -math.inf
    return v, s


def _close(v, s, want_v, want_s, dtype):
    tol = 1e-2 if dtype != torch.float32 else 1e-5
    assert rel_error(v.cpu().double(), want_v) < tol
    finite = torch.isfinite(want_s)
    assert torch.equal(torch.isfinite(s.cpu()), finite)
    assert torch.allclose(s.cpu().double()[finite], want_s[finite], atol=1e-4)
    assert not torch.isnan(v).any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_merge_state_matches_the_naive_merge(backend, dtype):
    v, s = _states(5, 2, 3, 24, seed=1, dtype=dtype, empty=[(1, 0, 0), (2, 0, 1), (2, 1, 1)])
    out, lse = flashinfer.merge_state(v[:, 0].to(DEV), s[:, 0].to(DEV), v[:, 1].to(DEV),
                                      s[:, 1].to(DEV), backend=backend)
    assert out.dtype == dtype and lse.dtype == torch.float32
    want_v, want_s = naive(v, s)
    _close(out, lse, want_v, want_s, dtype)
    assert bool((out[2, 1] == 0).all()) and lse[2, 1] == -math.inf  # both empty


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("masked", [False, True])
def test_merge_state_in_place_with_and_without_mask(backend, masked):
    v, s = _states(6, 2, 2, 40, seed=2, dtype=torch.bfloat16, empty=[(3, 1, 0)])
    mine_v, mine_s = v[:, 0].clone().to(DEV), s[:, 0].clone().to(DEV)
    mask = torch.tensor([True, False, True, True, False, True], device=DEV) if masked else None
    flashinfer.merge_state_in_place(mine_v, mine_s, v[:, 1].to(DEV), s[:, 1].to(DEV), mask,
                                    backend=backend)
    want_v, want_s = naive(v, s)
    if masked:  # skipped rows keep the first state
        keep = ~mask.cpu()
        want_v[keep], want_s[keep] = v[keep, 0].double(), s[keep, 0].double()
    _close(mine_v, mine_s, want_v, want_s, torch.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_states_and_the_variable_length_form(backend):
    v, s = _states(4, 5, 3, 20, seed=3, empty=[(0, 2, 1), (1, 0, 0)])
    out, lse = flashinfer.merge_states(v.to(DEV), s.to(DEV), backend=backend)
    want_v, want_s = naive(v, s)
    _close(out, lse, want_v, want_s, torch.float16)
    # rows of 2, 0 and 3 states out of a flat list
    flat_v = torch.cat([v[0, :2], v[1, :3]])
    flat_s = torch.cat([s[0, :2], s[1, :3]])
    indptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32, device=DEV)
    out, lse = flashinfer.triton.cascade.variable_length_merge_states(
        flat_v.to(DEV), flat_s.to(DEV), indptr) if backend == "triton" else \
        flashinfer.cascade.variable_length_merge_states(flat_v.to(DEV), flat_s.to(DEV), indptr,
                                                        backend=backend)
    parts = [naive(flat_v[a:b][None], flat_s[a:b][None]) for a, b in ((0, 2), (2, 2), (2, 5))]
    _close(out, lse, torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
           torch.float16)
    assert bool((out[1] == 0).all()) and bool((lse[1] == -math.inf).all())  # empty range


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_and_wide_heads(backend):
    """64 heads x 256 dims (past upstream's 1,024 threads a block) and non-contiguous views."""
    rows, heads, dim = 2, 64, 256 if HAS_CUDA or backend == "reference" else 40
    v, s = _states(rows, 2, heads, dim, seed=4, dtype=torch.float32)
    big = torch.randn(rows, heads, dim * 2)
    big[..., ::2] = v[:, 0]
    s_a = torch.randn(heads, rows).t()  # a transposed [rows, heads] view
    s_a.copy_(s[:, 0])
    out, lse = flashinfer.merge_state(big[..., ::2].to(DEV) if DEV == "cpu" else
                                      big.to(DEV)[..., ::2], s_a.to(DEV), v[:, 1].to(DEV),
                                      s[:, 1].to(DEV), backend=backend)
    want_v, want_s = naive(v, s)
    _close(out, lse, want_v, want_s, torch.float32)


def test_merged_split_attention_equals_attention_over_all_keys():
    """Attention over keys [0, 700) merged with [700, 1100) is attention over [0, 1100)."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(3, 4, 64, generator=gen, dtype=torch.float32)
    k = torch.randn(1100, 4, 64, generator=gen)
    v = torch.randn(1100, 4, 64, generator=gen)
    whole, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, return_lse=True)
    a, la = flashinfer.single_prefill_with_kv_cache(q, k[:700], v[:700], return_lse=True)
    b, lb = flashinfer.single_prefill_with_kv_cache(q, k[700:], v[700:], return_lse=True)
    merged, lm = flashinfer.merge_state(a, la, b, lb)
    assert rel_error(merged, whole) < 1e-5
    assert torch.allclose(lm, lse, atol=1e-4)


@pytest.mark.parametrize("call, words", [
    (lambda v, s: flashinfer.merge_state(v, s, v[:, :1], s[:, :1]), "v_b must match v_a"),
    (lambda v, s: flashinfer.merge_state(v.int(), s, v, s), "dtype"),
    (lambda v, s: flashinfer.merge_state(v, s[:, :1], v, s), "s_a must have shape"),
    (lambda v, s: flashinfer.merge_state_in_place(v, s.half(), v.clone(), s), "s must be float32"),
    (lambda v, s: flashinfer.merge_state_in_place(v, s, v.clone(), s, torch.ones(3)), "mask"),
    (lambda v, s: flashinfer.merge_states(v, s), "4-D"),
    (lambda v, s: flashinfer.cascade.variable_length_merge_states(
        v, s, torch.tensor([0, 3, 1], dtype=torch.int32)), "never decrease"),
    (lambda v, s: flashinfer.cascade.variable_length_merge_states(
        v, s, torch.tensor([0, 2], dtype=torch.int32)), "end at 4"),
])
def test_bad_input_is_refused(call, words):
    v, s = torch.randn(4, 2, 8), torch.randn(4, 2)
    with pytest.raises((ValueError, TypeError), match=words):
        call(v, s)


def test_registered_as_custom_ops_and_exported_as_upstream():
    for name in ("merge_state", "merge_state_in_place", "merge_states"):
        assert hasattr(torch.ops.flashinfer, name)
        assert getattr(flashinfer, name) is getattr(flashinfer.cascade, name)
    assert callable(flashinfer.triton.cascade.merge_states)


def test_poisoned_output_is_fully_written():
    v, s = _states(3, 2, 2, 16, seed=6, dtype=torch.float32)
    target_v, target_s = poison(torch.empty(3, 2, 16)), poison(torch.empty(3, 2))
    from flashinfer.backends.reference.cascade import merge_state

    merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1], target_v, target_s, None)
    assert not torch.isnan(target_v).any() and not torch.isnan(target_s).any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_triton_matches_the_reference_at_serving_shapes(dtype):
    """1,000 rows x 64 heads x 256 dims (upstream's CUDA kernel refuses this: 2,048 threads),
    two and five states, and an in-place masked merge replayed from a CUDA graph."""
    v, s = _states(1000, 5, 64, 256, seed=7, dtype=dtype, empty=[(3, i, 2) for i in range(5)])
    v, s = v.cuda(), s.cuda()
    for backend_pair in ((flashinfer.merge_states, (v, s)),
                         (flashinfer.merge_state, (v[:, 0], s[:, 0], v[:, 1], s[:, 1]))):
        fn, args = backend_pair
        got, got_s = fn(*args, backend="triton")
        want, want_s = fn(*args, backend="reference")
        assert rel_error(got.double(), want.double()) < 1e-2
        assert torch.equal(torch.isfinite(got_s), torch.isfinite(want_s))
        assert torch.allclose(got_s[torch.isfinite(want_s)], want_s[torch.isfinite(want_s)],
                              atol=1e-4)
    mine_v, mine_s = v[:, 0].clone(), s[:, 0].clone()
    mask = torch.rand(1000, device="cuda", generator=torch.Generator("cuda").manual_seed(8)) < 0.5
    graph = torch.cuda.CUDAGraph()
    flashinfer.merge_state_in_place(mine_v.clone(), mine_s.clone(), v[:, 1], s[:, 1], mask,
                                    backend="triton")  # compiles before capture
    with torch.cuda.graph(graph):
        flashinfer.merge_state_in_place(mine_v, mine_s, v[:, 1], s[:, 1], mask, backend="triton")
    graph.replay()
    torch.cuda.synchronize()
    want_v, want_s = v[:, 0].clone(), s[:, 0].clone()
    flashinfer.merge_state_in_place(want_v, want_s, v[:, 1], s[:, 1], mask, backend="reference")
    assert rel_error(mine_v.double(), want_v.double()) < 1e-2


def _paged(lengths, page, first_page=0):
    """``(indptr, indices, last_page_len)`` of requests of ``lengths`` tokens on consecutive
    pages from ``first_page``."""
    pages = [-(-n // page) for n in lengths]
    indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32)
    indices = torch.arange(first_page, first_page + sum(pages), dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(lengths, pages)], dtype=torch.int32)
    return indptr, indices, last


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("prefix", [1, 3, 4, 5, 37, 301])  # pages of 4: boundary -1 / 0 / +1
def test_cascade_wrapper_equals_attention_over_prefix_and_own_tokens(causal, prefix):
    """Two levels: a prefix shared by 3 requests (page 4: whole or partly filled last page),
    then each request's own 5 / 9 / 1 tokens; equal to one flat prefill of each request over
    [prefix | own] (causal: on the own tokens, bottom-right aligned)."""
    gen = torch.Generator().manual_seed(9 + prefix)
    heads, kv_heads, dim, page = 4, 2, 32, 4
    own, q_lens = [5, 9, 1], [2, 3, 1]
    shared = _paged([prefix], page)
    unique = _paged(own, page, first_page=int(shared[0][-1]))
    n_pages = int(shared[0][-1]) + int(unique[0][-1])
    cache = torch.randn(n_pages, 2, page, kv_heads, dim, generator=gen)
    q = torch.randn(sum(q_lens), heads, dim, generator=gen)
    qo = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    w = flashinfer.MultiLevelCascadeAttentionWrapper(2, torch.empty(1 << 20, dtype=torch.uint8))
    w.plan([torch.tensor([0, qo[-1]], dtype=torch.int32), qo], [shared[0], unique[0]],
           [shared[1], unique[1]], [shared[2], unique[2]], heads, kv_heads, dim, page,
           causal=causal, q_data_type=torch.float32)
    out = w.run(q, cache)
    flat = cache.permute(1, 0, 2, 3, 4).reshape(2, -1, kv_heads, dim)  # token t of page p: p*page+t
    for b in range(3):
        ids = list(range(prefix)) + [int(unique[1][unique[0][b]]) * page + t for t in range(own[b])]
        k, v = flat[0, ids], flat[1, ids]
        want = flashinfer.single_prefill_with_kv_cache(q[qo[b]:qo[b + 1]], k, v, causal=causal)
        assert rel_error(out[qo[b]:qo[b + 1]], want) < 1e-5, b
    assert len(w.level_decisions) == 2


def test_cascade_wrapper_refusals():
    w = flashinfer.MultiLevelCascadeAttentionWrapper(2, torch.empty(1 << 20, dtype=torch.uint8))
    one = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="list of 2"):
        w.plan([one], [one], [one], [one], 4, 2, 32, 4)
    with pytest.raises(ValueError, match="same queries"):
        w.plan([one, torch.tensor([0, 3], dtype=torch.int32)], [one, one],
               [torch.arange(2, dtype=torch.int32)] * 2, [torch.tensor([4], dtype=torch.int32)] * 2,
               4, 2, 32, 4)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(torch.randn(2, 4, 32), torch.randn(4, 2, 4, 2, 32))
    with pytest.raises(ValueError, match=r"num_qo_heads \(3\) must be a multiple"):
        w.plan([one, one], [one, one], [torch.arange(2, dtype=torch.int32)] * 2,
               [torch.tensor([4], dtype=torch.int32)] * 2, 3, 2, 32, 4)
    with pytest.raises(ValueError, match="num_levels"):
        flashinfer.MultiLevelCascadeAttentionWrapper(0, torch.empty(8, dtype=torch.uint8))


@pytest.mark.parametrize("form", ["decode", "prefill", "prefill_causal"])
def test_shared_prefix_wrappers_equal_attention_over_prefix_and_own_tokens(form):
    """The legacy two-level wrappers: a contiguous 21-token shared prefix, then each request's
    own paged tokens (page 4); equal to a flat prefill over [prefix | own]."""
    gen = torch.Generator().manual_seed(10)
    heads, kv_heads, dim, page, prefix = 4, 2, 32, 4, 21
    own = [6, 1, 9]
    q_lens = [1, 1, 1] if form == "decode" else [2, 1, 3]
    indptr, indices, last = _paged(own, page)
    cache = torch.randn(int(indptr[-1]), 2, page, kv_heads, dim, generator=gen)
    k_shared = torch.randn(prefix, kv_heads, dim, generator=gen)
    v_shared = torch.randn(prefix, kv_heads, dim, generator=gen)
    q = torch.randn(sum(q_lens), heads, dim, generator=gen)
    qo = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    causal = form == "prefill_causal"
    if form == "decode":
        w = flashinfer.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(ws)
        w.begin_forward(indptr, indices, last, heads, kv_heads, dim, page, data_type=torch.float32)
        out = w.forward(q, k_shared, v_shared, cache)
    else:
        w = flashinfer.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(ws)
        w.begin_forward(qo, indptr, indices, last, heads, kv_heads, dim, page)
        out = w.forward(q, k_shared, v_shared, cache, causal=causal)
    flat = cache.permute(1, 0, 2, 3, 4).reshape(2, -1, kv_heads, dim)
    for b in range(3):
        ids = [int(indices[indptr[b]]) * page + t for t in range(own[b])]
        k = torch.cat([k_shared, flat[0, ids]])
        v = torch.cat([v_shared, flat[1, ids]])
        want = flashinfer.single_prefill_with_kv_cache(q[qo[b]:qo[b + 1]], k, v, causal=causal)
        assert rel_error(out[qo[b]:qo[b + 1]], want) < 1e-5, b
    with pytest.raises(RuntimeError, match="before begin_forward"):
        type(w)(ws).forward(q, k_shared, v_shared, cache)


@pytest.mark.gpu
def test_gpu_cascade_cuda_graph_replay_equals_eager():
    """A two-level CUDA-graph cascade wrapper (fixed buffers per level) captured once, re-planned
    with other own-token lengths, replayed: equal to an eager wrapper planned the same way."""
    heads, kv_heads, dim, page, batch, prefix = 32, 8, 128, 16, 4, 40
    dev, i32 = "cuda", torch.int32
    bufs = [[torch.zeros(n, dtype=i32, device=dev) for n in (2, 2, 64, 1)],
            [torch.zeros(n, dtype=i32, device=dev) for n in (batch + 1, batch + 1, 64, batch)]]
    w = flashinfer.MultiLevelCascadeAttentionWrapper(
        2, torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD", use_cuda_graph=True,
        qo_indptr_buf_arr=[b[0] for b in bufs], paged_kv_indptr_buf_arr=[b[1] for b in bufs],
        paged_kv_indices_buf_arr=[b[2] for b in bufs],
        paged_kv_last_page_len_buf_arr=[b[3] for b in bufs])
    gen = torch.Generator(device=dev).manual_seed(11)
    cache = torch.randn(40, 2, page, kv_heads, dim, device=dev, generator=gen).to(torch.bfloat16)
    q = torch.randn(batch, heads, dim, device=dev, generator=gen).to(torch.bfloat16)
    qo = [torch.tensor([0, batch], dtype=i32), torch.arange(batch + 1, dtype=i32)]

    def plan(wrapper, own):
        shared = _paged([prefix], page)
        unique = _paged(own, page, first_page=int(shared[0][-1]))
        wrapper.plan(qo, [shared[0], unique[0]], [shared[1], unique[1]], [shared[2], unique[2]],
                     heads, kv_heads, dim, page, q_data_type=torch.bfloat16)

    plan(w, [5, 17, 1, 33])
    out = w.run(q, cache)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = w.run(q, cache)
    plan(w, [30, 2, 16, 9])
    poison(out)
    graph.replay()
    eager = flashinfer.MultiLevelCascadeAttentionWrapper(
        2, torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD")
    plan(eager, [30, 2, 16, 9])
    assert rel_error(out.double(), eager.run(q, cache).double()) < 1e-2
