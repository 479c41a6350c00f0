"""POD and holistic batch attention (flashinfer/attention/pod.py, mixed_batch.py) against float64
naive attention: the single-prefill POD, the batch POD in its mixed form (one cache) and its
two-stream form (two caches, or a custom mask), empty prefill or decode sides, BatchAttention
over a mixed batch; bad input refused. CPU: the reference backends; on a GPU, ``auto``."""

from __future__ import annotations

import pytest
import torch

from attention_helpers import make_paged, naive_batch
from conftest import HAS_CUDA, rel_error
import flashinfer

DEV = "cuda:0" if HAS_CUDA else "cpu"
DTYPE = torch.bfloat16 if HAS_CUDA else torch.float32
TOL = 2e-2 if HAS_CUDA else 1e-5
HQ, HK, D, PAGE = 4, 2, 32, 4
SCALE = D ** -0.5


def _ws():
    return torch.empty(16 << 20, dtype=torch.uint8, device=DEV)


def _paged(kv_lens, seed):
    torch.manual_seed(seed)
    cache, indptr, indices, last, ks, vs = make_paged(kv_lens, PAGE, HK, D, "NHD")
    return cache.to(DEV, DTYPE), indptr, indices, last, ks, vs


def _q(rows, seed):
    return torch.randn(rows, HQ, D, generator=torch.Generator().manual_seed(seed)).to(DEV, DTYPE)


def _naive(q, ks, vs, qo_lens, causal):
    return naive_batch(q.cpu().float(), torch.cat(ks).float(), torch.cat(vs).float(), qo_lens,
                       [k.shape[0] for k in ks], sm_scale=SCALE, causal=causal)


def test_single_prefill_pod_equals_prefill_and_decode():
    qo_len = 37
    gen = torch.Generator().manual_seed(1)
    q_p = _q(qo_len, 2)
    k_p, v_p = (torch.randn(qo_len, HK, D, generator=gen).to(DEV, DTYPE) for _ in range(2))
    kv_d = [5, 4, 9, 1, 16]
    cache, indptr, indices, last, ks, vs = _paged(kv_d, seed=3)
    q_d = _q(len(kv_d), 4)
    w = flashinfer.PODWithPagedKVCacheWrapper(_ws())
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=DTYPE)
    out_p, out_d = w.run(q_p, k_p, v_p, q_d, cache, causal_p=True)
    want_p, _ = _naive(q_p, [k_p.cpu()], [v_p.cpu()], [qo_len], True)
    want_d, _ = _naive(q_d, ks, vs, [1] * len(kv_d), False)
    assert rel_error(out_p.cpu(), want_p) < TOL and rel_error(out_d.cpu(), want_d) < TOL
    assert w.mode == "two_streams" and set(w.decisions) == {"decode"}


def _batch_pod_case(seed):
    qo_p, kv_p, kv_d = [7, 1, 20], [9, 3, 20], [5, 12, 1, 8]
    cache, indptr, indices, last, ks, vs = _paged(kv_p + kv_d, seed)
    n = len(kv_p)
    arrays_p = (torch.tensor([0, 7, 8, 28], dtype=torch.int32), indptr[:n + 1],
                indices[:int(indptr[n])], last[:n])
    arrays_d = (torch.arange(len(kv_d) + 1, dtype=torch.int32), indptr[n:] - indptr[n],
                indices[int(indptr[n]):], last[n:])
    return qo_p, cache, arrays_p, arrays_d, ks[:n], vs[:n], ks[n:], vs[n:]


@pytest.mark.parametrize("form", ["mixed", "two_caches", "masked"])
def test_batch_pod_equals_prefill_and_decode(form):
    qo_p, cache, arrays_p, arrays_d, ks_p, vs_p, ks_d, vs_d = _batch_pod_case(seed=5)
    w = flashinfer.BatchPODWithPagedKVCacheWrapper(_ws())
    w.plan(*arrays_p, *arrays_d, HQ, HK, D, PAGE, q_data_type=DTYPE)
    q_p, q_d = _q(sum(qo_p), 6), _q(len(ks_d), 7)
    extra, causal = {}, True
    cache_d = cache
    if form == "two_caches":
        cache_d = cache.clone()
    elif form == "masked":  # a mask equal to causal: the two-stream form, the same result
        parts = [torch.ones(m, k.shape[0], dtype=torch.bool).tril(k.shape[0] - m).reshape(-1)
                 for m, k in zip(qo_p, ks_p)]
        extra, causal = {"custom_mask_p": torch.cat(parts).to(DEV)}, False
    (out_p, lse_p), (out_d, lse_d) = w.run(q_p, cache, q_d, cache_d, causal_p=causal,
                                           return_lse=True, **extra)
    assert w.mode == "two_streams"
    want_p, want_lse_p = _naive(q_p, ks_p, vs_p, qo_p, True)
    want_d, want_lse_d = _naive(q_d, ks_d, vs_d, [1] * len(ks_d), False)
    assert rel_error(out_p.cpu(), want_p) < TOL and rel_error(out_d.cpu(), want_d) < TOL
    assert rel_error(lse_p.cpu(), want_lse_p) < TOL and rel_error(lse_d.cpu(), want_lse_d) < TOL
    again_p, again_d = w.run(q_p, cache, q_d, cache_d, causal_p=causal, **extra)  # no re-plan
    assert torch.equal(again_p, out_p) and torch.equal(again_d, out_d)


@pytest.mark.parametrize("empty", ["prefill", "decode"])
def test_batch_pod_with_an_empty_side(empty):
    qo_p, cache, arrays_p, arrays_d, ks_p, vs_p, ks_d, vs_d = _batch_pod_case(seed=8)
    none = (torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
            torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))
    if empty == "prefill":
        arrays_p, qo_p, ks_p = none, [], []
    else:
        arrays_d, ks_d = none, []
    w = flashinfer.BatchPODWithPagedKVCacheWrapper(_ws())
    w.plan(*arrays_p, *arrays_d, HQ, HK, D, PAGE, q_data_type=DTYPE)
    q_p, q_d = _q(sum(qo_p), 6), _q(len(ks_d), 7)
    out_p, out_d = w.run(q_p, cache, q_d, cache, causal_p=True)
    assert out_p.shape == q_p.shape and out_d.shape == q_d.shape
    got, ks, vs, q, lens = ((out_d, ks_d, vs_d, q_d, [1] * len(ks_d)) if empty == "prefill"
                            else (out_p, ks_p, vs_p, q_p, qo_p))
    assert rel_error(got.cpu(), _naive(q, ks, vs, lens, True)[0]) < TOL
    assert w.mode == ("decode" if empty == "prefill" else "prefill")


def test_batch_attention_over_a_mixed_batch():
    qo_lens, kv_lens = [1, 7, 1, 20, 1], [9, 7, 4, 33, 1]
    cache, indptr, indices, last, ks, vs = _paged(kv_lens, seed=9)
    qo = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    w = flashinfer.attention.BatchAttention(device=DEV)
    w.plan(qo, indptr, indices, torch.tensor(kv_lens, dtype=torch.int32), HQ, HK, D, D, PAGE,
           causal=True, q_data_type=DTYPE, kv_data_type=DTYPE)
    q = _q(sum(qo_lens), 10)
    out, lse = w.run(q, cache)
    want, want_lse = _naive(q, ks, vs, qo_lens, True)
    assert rel_error(out.cpu(), want) < TOL and rel_error(lse.cpu(), want_lse) < TOL
    assert w.mode == "two_streams" and set(w.decisions) == {"prefill", "decode"}
    w.plan(torch.tensor([0, 2, 9], dtype=torch.int32), indptr[:3], indices,
           torch.tensor(kv_lens[:2], dtype=torch.int32), HQ, HK, D, D, PAGE, causal=True,
           q_data_type=DTYPE, kv_data_type=DTYPE)  # no decode request
    out, lse = w.run(q[:9], cache)
    assert w.mode == "prefill"
    assert rel_error(out.cpu(), _naive(q[:9], ks[:2], vs[:2], [2, 7], True)[0]) < TOL


def test_bad_input_is_refused():
    w = flashinfer.attention.BatchAttention(device=DEV)
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    with pytest.raises(ValueError, match=r"kv_len_arr\[1\] = 9 does not fit request 1's 2 pages"):
        w.plan(i32(0, 1, 2), i32(0, 1, 3), i32(0, 1, 2), i32(3, 9), HQ, HK, D, D, PAGE)
    with pytest.raises(ValueError, match=r"kv_len_arr\[0\] = 4 does not fit"):
        w.plan(i32(0, 1), i32(0, 2), i32(0, 1), i32(4), HQ, HK, D, D, PAGE)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(_q(1, 0), torch.zeros(1))
    pod = flashinfer.BatchPODWithPagedKVCacheWrapper(_ws())
    with pytest.raises(ValueError, match="qo_indptr_d must be"):
        pod.plan(i32(0, 2), i32(0, 1), i32(0), i32(2), i32(0, 2), i32(0, 1), i32(1), i32(1),
                 HQ, HK, D, PAGE)
    pod.plan(i32(0, 2), i32(0, 1), i32(0), i32(2), i32(0, 1), i32(0, 1), i32(1), i32(1),
             HQ, HK, D, PAGE, q_data_type=DTYPE)
    with pytest.raises(ValueError, match=r"q_d must be \[1, H_qo, D\]"):
        pod.run(_q(2, 0), torch.zeros(1), _q(3, 0), torch.zeros(1))


@pytest.mark.gpu
def test_gpu_single_prefill_pod_replayed_from_a_cuda_graph_equals_eager():
    """The single-prefill POD with use_cuda_graph=True (side stream forked and joined inside the
    capture) replays equal to its eager run, after the inputs changed in place."""
    qo_len, kv_d = 37, [5, 4, 9, 1, 16]
    gen = torch.Generator().manual_seed(21)
    q_p = _q(qo_len, 22)
    k_p, v_p = (torch.randn(qo_len, HK, D, generator=gen).to(DEV, DTYPE) for _ in range(2))
    cache, indptr, indices, last, *_ = _paged(kv_d, seed=23)
    q_d = _q(len(kv_d), 24)
    bufs = [indptr.to(DEV), indices.to(DEV), last.to(DEV)]
    w = flashinfer.PODWithPagedKVCacheWrapper(_ws(), use_cuda_graph=True,
                                              paged_kv_indptr_buffer=bufs[0],
                                              paged_kv_indices_buffer=bufs[1],
                                              paged_kv_last_page_len_buffer=bufs[2])
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=DTYPE)
    w.run(q_p, k_p, v_p, q_d, cache, causal_p=True)  # warm (workspaces) before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_p, out_d = w.run(q_p, k_p, v_p, q_d, cache, causal_p=True)
    q_p.copy_(_q(qo_len, 25))
    q_d.copy_(_q(len(kv_d), 26))
    graph.replay()
    want_p, want_d = w.run(q_p, k_p, v_p, q_d, cache, causal_p=True)
    torch.cuda.synchronize()
    assert torch.equal(out_p, want_p) and torch.equal(out_d, want_d)


@pytest.mark.gpu
def test_gpu_batch_pod_refuses_a_cuda_graph_capture():
    """The batch POD has no fixed buffers (as upstream's): a capture is refused by name."""
    qo_p, cache, arrays_p, arrays_d, *_ = _batch_pod_case(seed=12)
    w = flashinfer.BatchPODWithPagedKVCacheWrapper(_ws())
    w.plan(*arrays_p, *arrays_d, HQ, HK, D, PAGE, q_data_type=DTYPE)
    q_p, q_d = _q(sum(qo_p), 13), _q(len(arrays_d[3]), 14)
    w.run(q_p, cache, q_d, cache, causal_p=True)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="BatchPODWithPagedKVCacheWrapper.*CUDA graph"):
        with torch.cuda.graph(graph):
            w.run(q_p, cache, q_d, cache, causal_p=True)


def test_reserved_sms_reach_the_prefill_side(monkeypatch):
    """FLASHINFER_POD_RESERVED_SMS, read at plan(), is what the prefill half runs under."""
    import flashinfer.attention.pod as pod
    from flashinfer.device import reserved_sms

    seen = []

    def spy(first, second, reserve=0):
        seen.append(reserve)
        with pod.reserving_sms(reserve):
            seen.append(reserved_sms())
            a = first()
        return a, second()
    monkeypatch.setattr(pod, "concurrently", spy)
    monkeypatch.setenv("FLASHINFER_POD_RESERVED_SMS", "24")
    qo_p, cache, arrays_p, arrays_d, *_ = _batch_pod_case(seed=17)
    w = flashinfer.BatchPODWithPagedKVCacheWrapper(_ws())
    w.plan(*arrays_p, *arrays_d, HQ, HK, D, PAGE, q_data_type=DTYPE)
    w.run(_q(sum(qo_p), 1), cache, _q(len(arrays_d[3]), 2), cache, causal_p=True)
    assert seen == [24, 24] and reserved_sms() == 0
