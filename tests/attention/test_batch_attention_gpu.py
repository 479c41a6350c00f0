"""Every GPU backend with a record for the three batch ops vs the reference, on CUDA; and CUDA-graph
capture + replay equal to eager. A case a record rejects is skipped with the dispatcher's reasons."""

import pytest
import torch

from attention_helpers import make_paged
from conftest import rel_error
import flashinfer
from flashinfer.capability_db import database
from flashinfer.dispatch import BackendUnavailableError, NoBackendError

pytestmark = pytest.mark.gpu
OPS = ("batch_decode", "batch_prefill_paged", "batch_prefill_ragged")


def gpu_kernels():
    out = []
    for op in OPS:
        for rec in database().for_op(op):
            if rec.backend != "reference" and "cuda" in rec.devices:
                out.append((op, rec.backend if rec.variant == "default" else f"{rec.backend}:{rec.variant}"))
    return out


def _ws():
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


def _setup(op, backend, dtype, layout, kv_lens, qo_lens, ps=16, hq=32, hk=8, d=128, causal=True,
           window=-1, cap=None, kv_dtype=None, graph=False):
    torch.manual_seed(0)
    kv_dtype = kv_dtype or dtype
    dev = "cuda"
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(qo_indptr[-1]), hq, d, device=dev, dtype=dtype)
    kw = dict(window_left=window, logits_soft_cap=cap, q_data_type=dtype, kv_data_type=kv_dtype)
    if op == "batch_prefill_ragged":
        kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
        k = torch.randn(int(kv_indptr[-1]), hk, d, device=dev).to(kv_dtype)
        v = torch.randn(int(kv_indptr[-1]), hk, d, device=dev).to(kv_dtype)
        if layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)

        def make(b):
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(), layout, backend=b)
            w.plan(qo_indptr, kv_indptr, hq, hk, d, causal=causal, **kw)
            return w
        return make, q, (k, v)
    cache, indptr, indices, last, _, _ = make_paged(kv_lens, ps, hk, d, layout, torch.float32)
    cache = cache.to(dev).to(kv_dtype)

    def make(b):
        if op == "batch_decode":
            extra = {}
            if graph:
                extra = dict(use_cuda_graph=True, paged_kv_indptr_buffer=torch.empty_like(indptr, device=dev),
                             paged_kv_indices_buffer=torch.empty(len(indices) + 8, dtype=torch.int32, device=dev),
                             paged_kv_last_page_len_buffer=torch.empty_like(last, device=dev))
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), layout, backend=b, **extra)
            w.plan(indptr, indices, last, hq, hk, d, ps, **kw)
        else:
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), layout, backend=b)
            w.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, causal=causal, **kw)
        return w
    return make, q, (cache,)


CASES = {
    "ragged_lengths": dict(kv=[1, 15, 16, 17, 300, 1000]),
    "window_cap": dict(kv=[64, 513, 2000], window=100, cap=30.0),
    "fp8_kv": dict(kv=[17, 256, 1024], fp8=True),
    "page1": dict(kv=[1, 7, 200], ps=1),
}


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("op,backend", gpu_kernels())
def test_backend_vs_reference(op, backend, case, dtype, layout):
    cfg = CASES[case]
    qo = [1] * len(cfg["kv"]) if op == "batch_decode" else [min(n, 37) for n in cfg["kv"]]
    make, q, kv = _setup(op, backend, dtype, layout, cfg["kv"], qo, ps=cfg.get("ps", 16),
                         window=cfg.get("window", -1), cap=cfg.get("cap"),
                         kv_dtype=torch.float8_e4m3fn if cfg.get("fp8") and op != "batch_prefill_ragged" else None)
    try:
        w = make(backend)
    except (BackendUnavailableError, NoBackendError, NotImplementedError) as err:
        pytest.skip(f"{backend} rejects this case: {err}")
    ref = make("reference")
    scales = dict(k_scale=0.7, v_scale=1.3) if cfg.get("fp8") else {}
    try:
        o, lse = w.run(q, *kv, return_lse=True, **scales)
    except (BackendUnavailableError, NoBackendError) as err:
        pytest.skip(f"{backend} has no lse variant here: {err}")
    eo, el = ref.run(q, *kv, return_lse=True, **scales)
    torch.cuda.synchronize()
    assert rel_error(o, eo) < 2e-2
    finite = torch.isfinite(el)
    assert torch.equal(torch.isfinite(lse), finite)
    assert rel_error(lse[finite], el[finite]) < 1e-3


def test_capture_of_non_graph_wrapper_raises():
    make, q, kv = _setup("batch_decode", "auto", torch.bfloat16, "NHD", [17, 40], [1, 1])
    w = make("auto")
    w.run(q, *kv)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="use_cuda_graph"):
        with torch.cuda.graph(g):
            w.run(q, *kv)


@pytest.mark.parametrize("backend", sorted({b for op, b in gpu_kernels() if op == "batch_decode"}))
def test_cuda_graph_replay_equals_eager(backend):
    make, q, kv = _setup("batch_decode", backend, torch.bfloat16, "NHD", [17, 40, 300], [1, 1, 1],
                         graph=True)
    try:
        w = make(backend)
    except (BackendUnavailableError, NoBackendError) as err:
        pytest.skip(f"{backend} is not CUDA-graph capable here: {err}")
    out = torch.empty(q.shape[0], q.shape[1], q.shape[2], dtype=q.dtype, device="cuda")
    w.run(q, *kv, out=out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.run(q, *kv, out=out)
    q.copy_(torch.randn_like(q))
    eager = w.run(q, *kv)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_device_page_ids_are_checked_unless_trusted(monkeypatch):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws())
    indptr, last = torch.tensor([0, 2], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    args = (2, 2, 16, 4)
    with pytest.raises(ValueError, match="indices must be >= 0"):
        w.plan(indptr, torch.tensor([0, -2], dtype=torch.int32, device="cuda"), last, *args)
    cache = torch.randn(3, 2, 4, 2, 16, device="cuda", dtype=torch.float16)
    w.plan(indptr, torch.tensor([0, 7], dtype=torch.int32, device="cuda"), last, *args)
    with pytest.raises(ValueError, match="holds page id 7, beyond the"):
        w.run(torch.randn(1, 2, 16, device="cuda", dtype=torch.float16), cache)
    monkeypatch.setenv("FLASHINFER_TRUST_DEVICE_PAGE_IDS", "1")  # no synchronisation, no check
    w.plan(indptr, torch.tensor([0, -2], dtype=torch.int32, device="cuda"), last, *args)
    assert w._max_page == -1


@pytest.mark.parametrize("op,backend", [c for c in gpu_kernels() if c[0] != "batch_decode"])
def test_run_with_and_without_out(op, backend):
    """run() without out (FA2 / FA3 then return their kernels' own output) equals run() into a
    given out, which is the tensor returned; with a v_scale and the lse too."""
    make, q, kv = _setup(op, backend, torch.bfloat16, "NHD", [40, 300], [17, 37])
    try:
        w = make(backend)
    except (BackendUnavailableError, NoBackendError, NotImplementedError) as err:
        pytest.skip(f"{backend} rejects this case: {err}")
    for kw in ({}, dict(v_scale=0.5, return_lse=True)):
        made = w.run(q, *kv, **kw)
        out = torch.full_like(q, float("nan"))
        given = w.run(q, *kv, out=out, **kw)
        if kw:
            (made, made_lse), (given, given_lse) = made, given
            assert torch.equal(made_lse, given_lse)
        assert given is out and made.is_contiguous() and made.dtype == q.dtype
        assert torch.equal(made, out)
