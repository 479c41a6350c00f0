"""Upstream's decode entry points beyond the wrapper's plan/run: fast_decode_plan (bound onto a
wrapper, SGLang), workspace_size(), and the private helpers engines call or probe
(flashinfer.decode._get_range_buf, _grouped_size_compiled_for_decode_kernels)."""

from __future__ import annotations

import functools

import pytest
import torch

from attention_helpers import make_paged, ws
import flashinfer
from flashinfer import decode


def _paged(seed=0):
    torch.manual_seed(seed)
    cache, indptr, indices, last, _, _ = make_paged([7, 20, 3], 4, 2, 16, "NHD")
    return cache, indptr, indices, last, torch.randn(3, 4, 16)


def test_fast_decode_plan_bound_as_begin_forward_plans_like_plan():
    cache, indptr, indices, last, q = _paged()
    planned = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    planned.plan(indptr, indices, last, 4, 2, 16, 4, q_data_type=torch.float32)
    fast = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    fast.begin_forward = functools.partial(flashinfer.fast_decode_plan, fast)
    # upstream's dtype rule: data_type fills q and kv; the device indptr is not read
    fast.begin_forward(torch.full_like(indptr, -5), indices, last, 4, 2, 16, 4,
                       data_type=torch.float32, global_override_indptr_cpu=indptr)
    assert fast._plan.q_dtype == fast._plan.kv_dtype == torch.float32
    torch.testing.assert_close(fast.run(q, cache), planned.run(q, cache), rtol=0, atol=0)
    assert decode.fast_decode_plan is flashinfer.fast_decode_plan


def test_fast_decode_plan_dtype_defaults():
    _, indptr, indices, last, _ = _paged()
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    flashinfer.fast_decode_plan(w, indptr, indices, last, 4, 2, 16, 4)
    assert w._plan.q_dtype == w._plan.kv_dtype == torch.float16
    flashinfer.fast_decode_plan(w, indptr, indices, last, 4, 2, 16, 4, q_data_type="bfloat16",
                                data_type=torch.float16)
    assert (w._plan.q_dtype, w._plan.kv_dtype) == (torch.bfloat16, torch.float16)


def test_workspace_size_plans_nothing_and_covers_the_triton_scratch():
    cache, indptr, indices, last, q = _paged()
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    float_bytes, int_bytes = w.workspace_size(indptr, indices, last, 4, 2, 16, 4,
                                              q_data_type=torch.float32)
    assert w._plan is None and int_bytes == 0 and float_bytes > 0
    with pytest.raises(TypeError):
        w.workspace_size(indptr, indices, last, 4, 2, 16, 4, not_an_argument=1)
    # a buffer of exactly that size serves the Triton split-K decode (interpreter on a CPU)
    small = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(float_bytes, dtype=torch.uint8),
                                                          backend="triton")
    small.plan(indptr, indices, last, 4, 2, 16, 4, q_data_type=torch.float16)
    q16, cache16 = q.half(), cache.half()
    torch.testing.assert_close(small.run(q16, cache16),
                               _reference(indptr, indices, last, q16, cache16),
                               rtol=2e-3, atol=2e-3)
    for wrapper, args in ((flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws()),
                           (torch.tensor([0, 2]), torch.tensor([0, 5]), 4, 2, 16)),
                          (flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws()),
                           (torch.tensor([0, 2]), indptr[:2], indices, last[:1], 4, 2, 16, 4))):
        assert wrapper.workspace_size(*args) == (0, 0) and wrapper._plan is None


def _reference(indptr, indices, last, q, cache):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), backend="reference")
    w.plan(indptr, indices, last, 4, 2, 16, 4, q_data_type=q.dtype)
    return w.run(q, cache)


def test_private_helpers_engines_call():
    r = decode._get_range_buf(5, "cpu")
    assert r.dtype == torch.int32 and r.tolist() == [0, 1, 2, 3, 4]
    assert decode._get_range_buf(5, torch.device("cpu")) is r
    assert decode._grouped_size_compiled_for_decode_kernels(32, 8)
    assert decode._grouped_size_compiled_for_decode_kernels(6, 1)
    assert not decode._grouped_size_compiled_for_decode_kernels(6, 4)


@pytest.mark.parametrize("form", ["tensor_core", "cuda_core"])
def test_cached_module_plan_replans_from_the_fixed_buffers(form):
    """vLLM's CUDA-graph fast path: after one plan(), it writes the page ids into the wrapper's
    fixed buffers and calls wrapper._cached_module.plan(...) with upstream's positional list."""
    torch.manual_seed(3)
    hq, hk, d, ps = 4, 2, 16, 4
    cache, indptr, indices, last, _, _ = make_paged([7, 20, 3], ps, hk, d, "NHD", spare=8)
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(4, dtype=torch.int32),
                paged_kv_indices_buffer=torch.zeros(32, dtype=torch.int32),
                paged_kv_last_page_len_buffer=torch.zeros(3, dtype=torch.int32))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), "NHD", use_cuda_graph=True, **bufs)
    w.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=torch.float32, sm_scale=0.3)
    assert w._cached_module is not None
    # the next step: other lengths, other pages; the engine writes the fixed buffers itself
    _, indptr2, indices2, last2, _, _ = make_paged([5, 9, 16], ps, hk, d, "NHD", spare=8)
    indices2 = (indices2 + 3) % cache.shape[0]
    bufs["paged_kv_indices_buffer"][:indices2.shape[0]] = indices2
    bufs["paged_kv_last_page_len_buffer"][:] = last2
    kv_lens = torch.tensor([5, 9, 16], dtype=torch.int32)
    if form == "tensor_core":
        args = (ws(), None, None, torch.arange(4, dtype=torch.int32), indptr2, kv_lens, 3, 3, hq,
                hk, ps, True, d, d, False, -1, -1, False)
    else:
        args = (ws(), None, None, indptr2, 3, hq, hk, ps, True, -1, 0.0, d, d, None, None)
    w._cached_module.plan(*args)
    q = torch.randn(3, hq, d)
    want = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    want.plan(indptr2, indices2, last2, hq, hk, d, ps, q_data_type=torch.float32, sm_scale=0.3)
    torch.testing.assert_close(w.run(q, cache), want.run(q, cache), rtol=0, atol=0)
    with pytest.raises(TypeError, match="positional forms"):
        w._cached_module.plan(1, 2, 3)
