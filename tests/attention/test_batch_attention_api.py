"""Batch wrapper API rules: validation (issue 3, deliverable 5), plan() positional orders,
CUDA-graph wrapper rules, aliases, and Decisions on simulated SMs."""

import warnings

import numpy as np
import pytest
import torch

from attention_helpers import make_paged, ws
import flashinfer
from flashinfer import dispatch
from flashinfer.attention.batch_checks import require_workspace
from flashinfer.device import simulated

I32 = torch.int32


def _decode(ps=4, lens=(3, 9), hq=4, hk=2, d=16):
    torch.manual_seed(0)
    cache, indptr, indices, last, _, _ = make_paged(list(lens), ps, hk, d, "NHD")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    w.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=torch.float32)
    return w, cache, torch.randn(len(lens), hq, d)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.float32, torch.bfloat16])
def test_a_workspace_of_any_dtype_is_bytes(dtype):
    """Upstream treats the workspace as raw bytes: int8 (as many callers allocate it), floats."""
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(1 << 16, dtype=dtype), "NHD")
    assert w._float_workspace_buffer.dtype == dtype  # the attribute engines read stays theirs
    w.plan(torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
           torch.tensor([3], dtype=torch.int32), 4, 2, 16, 4, q_data_type=torch.float16,
           kv_data_type=torch.float16)
    cache = torch.randn(2, 2, 4, 2, 16, dtype=torch.float16)
    assert w.run(torch.randn(1, 4, 16, dtype=torch.float16), cache).shape == (1, 4, 16)
    assert w._plan.workspace.dtype == torch.uint8
    assert w._plan.workspace.numel() == (1 << 16) * torch.empty((), dtype=dtype).element_size()


def test_a_workspace_must_be_one_block_of_bytes():
    with pytest.raises(ValueError, match="float_workspace_buffer must be contiguous"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(64, 64)[:, :8], "NHD")
    with pytest.raises(TypeError, match="float_workspace_buffer must be a torch.Tensor"):
        flashinfer.BatchPrefillWithRaggedKVCacheWrapper(bytearray(64), "NHD")


def test_index_arrays_must_be_int32():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    with pytest.raises(ValueError, match="indptr.*int32"):
        w.plan(torch.tensor([0, 1]), torch.tensor([0], dtype=I32), torch.tensor([1], dtype=I32), 2, 2, 16, 4)


def test_indptr_not_monotone():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    with pytest.raises(ValueError, match="indptr.*monotone"):
        w.plan(torch.tensor([0, 2, 1], dtype=I32), torch.tensor([0, 1], dtype=I32),
               torch.tensor([1, 1], dtype=I32), 2, 2, 16, 4)


def test_indptr_wrong_length():
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws())
    with pytest.raises(ValueError, match="kv_indptr.*length"):
        w.plan(torch.tensor([0, 1, 2], dtype=I32), torch.tensor([0, 1], dtype=I32), 2, 2, 16)


def test_last_page_len_out_of_range():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    for bad in (0, 5):
        with pytest.raises(ValueError, match="last_page_len"):
            w.plan(torch.tensor([0, 1], dtype=I32), torch.tensor([0], dtype=I32),
                   torch.tensor([bad], dtype=I32), 2, 2, 16, 4)


def test_a_plan_that_fails_after_writing_buffers_leaves_no_plan(monkeypatch):
    w, cache, q = _decode(ps=4, lens=(5, 9), hq=4, hk=2, d=16)
    w.run(q, cache)

    def boom(*args, **kwargs):
        raise RuntimeError("planner failed")
    monkeypatch.setattr(w, "_finish_plan", boom)
    with pytest.raises(RuntimeError, match="planner failed"):
        w.plan(torch.tensor([0, 2, 3], dtype=I32), torch.tensor([0, 1, 2], dtype=I32),
               torch.tensor([1, 2], dtype=I32), 4, 2, 16, 4, q_data_type=torch.float32)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(q, cache)  # the old plan's device arrays were overwritten: no silent stale run


def test_page_index_beyond_cache():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    cache = torch.randn(3, 2, 4, 2, 16)
    w.plan(torch.tensor([0, 1], dtype=I32), torch.tensor([7], dtype=I32),
           torch.tensor([2], dtype=I32), 2, 2, 16, 4, q_data_type=torch.float32)
    with pytest.raises(ValueError, match="holds page id 7, beyond the"):
        w.run(torch.randn(1, 2, 16), cache)
    with pytest.raises(ValueError, match="indices"):
        w.plan(torch.tensor([0, 1], dtype=I32), torch.tensor([-1], dtype=I32),
               torch.tensor([2], dtype=I32), 2, 2, 16, 4)


def test_largest_page_id_is_one_reduction_that_still_sees_negatives():
    from flashinfer.attention.batch_checks import largest_page_id
    ids = np.array([3, 0x7FFFFFFF, 5], dtype=np.int32)
    assert largest_page_id(ids, "kv_indices") == 0x7FFFFFFF
    with pytest.raises(ValueError, match=r"kv_indices must be >= 0.*got -2147483648"):
        largest_page_id(np.array([1, -(2**31), 2], dtype=np.int32), "kv_indices")
    with pytest.raises(ValueError, match=r"kv_indices must be >= 0.*got -1"):
        largest_page_id(np.array([9, -1], dtype=np.int32), "kv_indices")


def test_head_count_and_dim_differ_between_plan_and_run():
    w, cache, q = _decode()
    with pytest.raises(ValueError, match="q must have shape"):
        w.run(torch.randn(2, 8, 16), cache)
    with pytest.raises(ValueError, match="q must have shape"):
        w.run(torch.randn(2, 4, 32), cache)
    with pytest.raises(ValueError, match="kv heads"):
        w.run(q, torch.randn(cache.shape[0], 2, 4, 1, 16))
    with pytest.raises(ValueError, match="head dims"):
        w.run(q, torch.randn(cache.shape[0], 2, 4, 2, 8))


def test_q_and_kv_dtype_other_than_planned():
    w, cache, q = _decode()
    with pytest.raises(ValueError, match="q dtype"):
        w.run(q.half(), cache)
    with pytest.raises(ValueError, match="k_cache dtype"):
        w.run(q, cache.half())


def test_run_before_plan():
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws())
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(torch.randn(1, 2, 16), torch.randn(1, 2, 4, 2, 16))


def test_workspace_too_small_states_size():
    w, _, _ = _decode()
    with pytest.raises(ValueError, match="float_workspace_buffer.*needs 4194304 bytes"):
        require_workspace(w._plan, 4 << 20, "test planner")
    assert require_workspace(w._plan, 1024, "x").numel() == 1024


def test_window_left_at_run_must_match_plan_and_out_buffers_checked():
    w, cache, q = _decode()
    with pytest.raises(ValueError, match="window_left"):
        w.run(q, cache, window_left=3)
    with pytest.raises(ValueError, match="out must be"):
        w.run(q, cache, out=torch.empty(2, 4, 8))
    with pytest.raises(ValueError, match="lse must be"):
        w.run(q, cache, lse=torch.empty(2, 3), return_lse=True)
    with pytest.raises(ValueError, match="k_scale"):
        w.run(q, cache, k_scale=torch.ones(3))  # neither one element nor one per KV head
    with pytest.raises(TypeError, match="q_scale"):
        w.run(q, cache, q_scale=torch.tensor(1.0))
    for mode, head_dim in (("ROPE", 16), ("rope_llama", 16), (3, 16), ("ROPE_LLAMA", 15)):
        with pytest.raises(ValueError, match="pos_encoding_mode"):
            w.plan(torch.tensor([0, 1], dtype=I32), torch.tensor([0], dtype=I32),
                   torch.tensor([1], dtype=I32), 2, 2, head_dim, 4, pos_encoding_mode=mode)


def test_decode_plan_legacy_positional_order():
    w, cache, q = _decode()
    torch.manual_seed(0)
    _, indptr, indices, last, _, _ = make_paged([3, 9], 4, 2, 16, "NHD")
    with pytest.warns(DeprecationWarning):
        # pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type, o_data_type,
        # data_type, sm_scale
        w.plan(indptr, indices, last, 4, 2, 16, 4, "NONE", 2, 5.0, torch.float32, torch.float32,
               torch.bfloat16, None, 0.3)
    assert (w._window_left, w._logits_soft_cap, w._sm_scale) == (2, 5.0, 0.3)
    assert w._plan.o_dtype == torch.bfloat16 and w._plan.kv_dtype == torch.float32


def test_paged_prefill_plan_positional_order():
    torch.manual_seed(0)
    _, indptr, indices, last, _, _ = make_paged([3, 9], 4, 2, 16, "NHD")
    qo = torch.tensor([0, 1, 3], dtype=I32)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws())
    # head_dim_vo, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
    # use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap
    w.plan(qo, indptr, indices, last, 4, 2, 16, 4, None, None, None, True, "NONE", False, 0.3, 2, 5.0)
    assert (w._causal, w._sm_scale, w._window_left, w._logits_soft_cap) == (True, 0.3, 2, 5.0)


def test_ragged_prefill_plan_positional_order():
    qo = torch.tensor([0, 1, 3], dtype=I32)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws())
    # head_dim_vo, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
    # use_fp16_qk_reduction, window_left, logits_soft_cap, sm_scale
    w.plan(qo, qo, 4, 2, 16, None, None, None, True, "NONE", False, 2, 5.0, 0.3)
    assert (w._causal, w._sm_scale, w._window_left, w._logits_soft_cap) == (True, 0.3, 2, 5.0)


def test_aliases_and_forward():
    w, cache, q = _decode()
    out = w.run(q, cache)
    o2, lse = w.run_return_lse(q, cache)
    assert torch.equal(out, o2) and lse.shape == (2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        o3 = w.forward(q, cache, sm_scale=w._sm_scale)
        o4, _ = w.forward_return_lse(q, cache)
        o5 = w.forward(q, cache, logits_soft_cap=3.0)  # re-plans
    assert torch.allclose(out, o3) and torch.allclose(out, o4)
    assert w._logits_soft_cap == 3.0 and not torch.allclose(out, o5)
    assert w.begin_forward is not None and w.end_forward() is None


def test_prefill_forward_takes_upstreams_positional_and_keyword_forms():
    """forward(q, paged_kv_cache, causal, ...) / forward(q, k, v, causal, ...) as upstream
    spells them: keywords for the caches, causal positionally (it re-plans when it changes)."""
    torch.manual_seed(3)
    cache, indptr, indices, last, _, _ = make_paged([5, 9], 4, 2, 16, "NHD")
    qo = torch.tensor([0, 3, 7], dtype=I32)
    q = torch.randn(7, 4, 16)
    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws())
    paged.plan(qo, indptr, indices, last, 4, 2, 16, 4, causal=True, q_data_type=torch.float32,
               kv_data_type=torch.float32)
    want = paged.run(q, cache)
    kv = torch.randn(14, 2, 16), torch.randn(14, 2, 16)
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws())
    ragged.plan(qo, torch.tensor([0, 5, 14], dtype=I32), 4, 2, 16, causal=True,
                q_data_type=torch.float32, kv_data_type=torch.float32)
    want_ragged = ragged.run(q, *kv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert torch.equal(paged.forward(q, paged_kv_cache=cache, causal=True), want)
        assert torch.equal(paged.forward(q, cache, True), want)
        out, lse = paged.forward_return_lse(q, paged_kv_cache=cache, causal=True)
        assert torch.equal(out, want) and lse.shape == (7, 4)
        assert torch.equal(ragged.forward(q, k=kv[0], v=kv[1], causal=True), want_ragged)
        assert torch.equal(ragged.forward(q, kv[0], kv[1], True), want_ragged)
        assert not torch.allclose(ragged.forward(q, *kv, False), want_ragged)  # re-planned
    assert ragged._causal is False


def test_cuda_graph_wrappers_require_buffers():
    with pytest.raises(ValueError, match="paged_kv_last_page_len_buffer"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), use_cuda_graph=True)
    buf = lambda n: torch.zeros(n, dtype=I32)  # noqa: E731
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer must have length 3"):
        flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws(), buf(2), buf(8), buf(2))
    w = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws(), buf(3), buf(8), buf(2))
    assert w.is_cuda_graph_enabled and w._fixed_batch_size == 2
    with pytest.raises(ValueError, match="fixed batch size"):
        w.plan(torch.tensor([0, 1], dtype=I32), torch.tensor([0], dtype=I32),
               torch.tensor([1], dtype=I32), 2, 2, 16, 4)
    with pytest.raises(ValueError, match="qo_indptr_buf"):
        flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws(), use_cuda_graph=True)
    with pytest.raises(ValueError, match="kv_indptr_buf"):
        flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws(), use_cuda_graph=True, qo_indptr_buf=buf(3))


def test_cuda_graph_plan_copies_into_fixed_buffers():
    buf = lambda n: torch.full((n,), -7, dtype=I32)  # noqa: E731
    w = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws(), buf(3), buf(8), buf(2))
    torch.manual_seed(0)
    cache, indptr, indices, last, _, _ = make_paged([3, 9], 4, 2, 16, "NHD")
    w.plan(indptr, indices, last, 4, 2, 16, 4, q_data_type=torch.float32)
    assert w._paged_kv_indices_buf[:len(indices)].tolist() == indices.tolist()
    assert w._paged_kv_indptr_buf.tolist() == indptr.tolist()
    assert w._plan.kv_indices.data_ptr() == w._paged_kv_indices_buf.data_ptr()


OPS = ("batch_decode", "batch_prefill_paged", "batch_prefill_ragged")
SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sm", SMS)
def test_decisions_on_simulated_sms(op, sm):
    device = torch.device("cpu") if sm == "cpu" else simulated(sm)
    problem = dispatch.Problem.make(
        op, device, dtypes={"q": torch.bfloat16, "kv": torch.bfloat16, "o": torch.bfloat16},
        shape={"head_dim_qk": 128, "head_dim_vo": 128, "num_qo_heads": 32, "num_kv_heads": 8,
               "batch_size": 64, "max_qo_len": 1 if op == "batch_decode" else 1024,
               "max_kv_len": 4096, "total_qo_len": 64, "page_size": 0 if "ragged" in op else 16,
               "q_len_per_req": 1 if op == "batch_decode" else 0},
        features=["gqa"] + ([] if op == "batch_decode" else ["causal"]), layout="NHD")
    decision = dispatch.select(problem, assume_installed=True)
    if sm == "cpu":
        assert decision.backend == "reference"
        assert [c.name for c in decision.candidates if c.usable] == ["reference"]
    else:
        assert decision.source == "default"
        assert decision.order[-1] == "reference"
        # dispatch_rules/<op>.toml: this family's priority (no threshold applies at this shape)
        assert decision.rule.startswith("priority[")
        assert "attention_h200" in decision.basis or sm != "9.0"
    assert "reference" in [c.backend for c in decision.candidates]


@pytest.mark.parametrize("batch, graph, want", [(8, True, "triton"), (8, False, "cudnn"),
                                                (64, True, "cudnn")])
def test_small_graph_decode_goes_to_triton_on_sm90(batch, graph, want):
    """GPU time decides a captured decode (launch cost is gone): Triton below batch 16."""
    problem = dispatch.Problem.make(
        "batch_decode", simulated("9.0"), dtypes={"q": "bfloat16", "kv": "bfloat16", "o": "bfloat16"},
        shape={"head_dim_qk": 128, "head_dim_vo": 128, "num_qo_heads": 32, "num_kv_heads": 8,
               "batch_size": batch, "max_qo_len": 1, "max_kv_len": 4096, "total_qo_len": batch,
               "page_size": 16, "q_len_per_req": 1},
        features=["gqa"] + (["cuda_graph"] if graph else []), layout="NHD")
    decision = dispatch.select(problem, assume_installed=True)
    assert decision.backend == want
    assert (decision.rule == "small_graph_decode_prefers_triton") == (want == "triton")


def test_reference_rejects_cuda_graph_problems():
    problem = dispatch.Problem.make(
        "batch_decode", simulated("9.0"), dtypes={"q": "bfloat16", "kv": "bfloat16", "o": "bfloat16"},
        shape={"head_dim_qk": 128, "head_dim_vo": 128, "num_qo_heads": 8, "num_kv_heads": 8,
               "batch_size": 4, "max_qo_len": 1, "max_kv_len": 64, "total_qo_len": 4,
               "page_size": 16, "q_len_per_req": 1}, features=["cuda_graph"], layout="NHD")
    ref = [c for c in dispatch.select(problem, assume_installed=True).candidates if c.backend == "reference"]
    assert ref and any(r.field == "feature" and r.actual == "cuda_graph" for r in ref[0].reasons)


def test_loglevel_1_logs_batch_calls_and_their_decisions():
    import subprocess
    import sys

    script = (
        "import torch, flashinfer\n"
        "cache = torch.randn(8, 2, 16, 2, 64, dtype=torch.float16)\n"
        "w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))\n"
        "w.plan(torch.tensor([0, 3, 5], dtype=torch.int32), torch.arange(5, dtype=torch.int32),\n"
        "       torch.tensor([4, 16], dtype=torch.int32), 2, 2, 64, 16, q_data_type=torch.float16)\n"
        "w.run(torch.randn(2, 2, 64, dtype=torch.float16), cache)\n")
    env = {**__import__("os").environ, "FLASHINFER_LOGLEVEL": "1", "FLASHINFER_LOGDEST": "stdout"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout
    assert "API call: BatchDecodeWithPagedKVCacheWrapper.plan" in out
    assert "API call: BatchDecodeWithPagedKVCacheWrapper.run" in out
    assert "problem: batch_decode on cpu" in out and "chosen:  reference" in out



def test_two_phase_planner_prepares_before_the_upload_and_finishes_with_its_views(monkeypatch):
    """A planner with ``prepare`` (batch_attention_params.Prepared): called before the plan's
    upload (device fields unset), its arrays sent with the index arrays, ``finish`` given their
    device views; the plan is complete when the runner runs."""
    import numpy as np

    from flashinfer.backends.reference import batch_attention as ref
    from flashinfer.attention.batch_params import Prepared

    seen = {}

    def prepare(plan):
        seen["kv_indptr_before"] = plan.kv_indptr
        extra = np.arange(7, 12, dtype=np.int32)

        def finish(views):
            seen["views"] = {name: t.clone() for name, t in views.items()}
            seen["kv_indptr_after"] = plan.kv_indptr.clone()
            return ref.batch_decode(plan)
        return Prepared({"extra": (extra, None)}, finish)

    monkeypatch.setattr(ref.batch_decode, "prepare", prepare, raising=False)
    w, cache, q = _decode(lens=(5, 9, 2))
    assert seen["kv_indptr_before"] is None  # the Decision and prepare() need host values only
    assert seen["views"]["extra"].tolist() == [7, 8, 9, 10, 11]
    assert torch.equal(seen["kv_indptr_after"], w._plan.kv_indptr_host)
    out = w.run(q, cache)
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_run_remembers_a_checked_cache_but_rechecks_it_against_each_plan():
    """PagedCacheViews: the same cache object reuses its checked views (one KVInput, whose
    ``derived`` dict runners may fill); a replan whose page ids or dtype the cache cannot
    serve still raises, and a cache changed in place is unpacked again."""
    from flashinfer.attention.batch_checks import PagedCacheViews

    torch.manual_seed(0)
    cache, indptr, indices, last, _, _ = make_paged([9, 20], 4, 2, 16, "NHD", spare=0)
    views = PagedCacheViews()
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws())
    w.plan(indptr, indices, last, 4, 2, 16, 4, q_data_type=torch.float32)
    q = torch.randn(2, 4, 16)
    first = views.kv(cache, w._plan, w._max_page, w._check_kv, "indices")
    assert views.kv(cache, w._plan, w._max_page, w._check_kv, "indices") is first
    assert views.kv((first.k, first.v), w._plan, w._max_page, w._check_kv, "indices").k is first.k
    want = w.run(q, cache)
    torch.testing.assert_close(w.run(q, cache), want, rtol=0, atol=0)
    n_pages = cache.shape[0]
    w.plan(torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, n_pages], dtype=torch.int32),
           torch.tensor([4, 4], dtype=torch.int32), 4, 2, 16, 4, q_data_type=torch.float32)
    with pytest.raises(ValueError, match="beyond the"):
        w.run(q, cache)
    w.plan(indptr, indices, last, 4, 2, 16, 4, q_data_type=torch.float32,
           kv_data_type=torch.float16)
    with pytest.raises(ValueError, match="kv_data_type"):
        w.run(q, cache)
    cache.resize_(cache.shape[0] + 1, *cache.shape[1:])  # same object, other geometry
    changed = views.kv(cache, w._plan, w._max_page, lambda *a: None, "indices")
    assert changed is not first and changed.k.shape[0] == n_pages + 1


def test_run_checks_again_whatever_differs_from_the_last_checked_call():
    """run() skips the q / k / v checks for the facts its last call of the same plan passed
    (shapes, dtypes, devices, window_left), and checks anything else; a new plan checks anew."""
    torch.manual_seed(5)
    indptr = torch.tensor([0, 3, 8], dtype=torch.int32)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws(), "NHD")
    w.plan(indptr, indptr, 4, 2, 16, causal=True, q_data_type=torch.float32)
    q, k, v = torch.randn(8, 4, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16)
    first = w.run(q, k, v)
    torch.testing.assert_close(w.run(q, k, v), first, rtol=0, atol=0)
    with pytest.raises(ValueError, match="dtype"):
        w.run(q, k.double(), v)
    with pytest.raises(ValueError, match="must be"):
        w.run(q, k[:, :1], v)
    with pytest.raises(ValueError, match="shape"):
        w.run(q[:7], k, v)
    with pytest.raises(ValueError, match="dtype"):
        w.run(q.half(), k, v)
    with pytest.raises(ValueError, match="window_left"):
        w.run(q, k, v, window_left=2)
    w.plan(torch.tensor([0, 2, 8], dtype=torch.int32), indptr, 4, 2, 16, causal=True,
           q_data_type=torch.float32)
    w.run(q, k, v)
    with pytest.raises(ValueError, match="shape"):  # the new plan's q, checked
        w.run(q[:7], k, v)


@pytest.mark.parametrize("multi_item", [False, True])
def test_paged_prefill_cached_module_plan_replans_from_the_fixed_buffers(multi_item):
    """SGLang's fast_prefill_plan: after one plan() of a CUDA-graph paged prefill wrapper, the
    engine writes the page ids into its fixed buffer, sets the multi-item attributes, and calls
    wrapper._cached_module.plan(...) with upstream's 19 positional prefill-module arguments; the
    run equals a fresh wrapper planned with the same arrays."""
    torch.manual_seed(7)
    hq, hk, d, ps = 4, 2, 16, 4
    cache, indptr, indices, last, _, _ = make_paged([7, 20, 3], ps, hk, d, "NHD", spare=8)
    bufs = dict(qo_indptr_buf=torch.zeros(4, dtype=torch.int32),
                paged_kv_indptr_buf=torch.zeros(4, dtype=torch.int32),
                paged_kv_indices_buf=torch.zeros(32, dtype=torch.int32),
                paged_kv_last_page_len_buf=torch.zeros(3, dtype=torch.int32))
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws(), "NHD", use_cuda_graph=True, **bufs)
    qo_indptr = torch.tensor([0, 3, 9, 12], dtype=torch.int32)
    w.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, causal=True, sm_scale=0.3,
           logits_soft_cap=7.0, q_data_type=torch.float32)
    assert w._cached_module is not None
    kv_lens2 = [5, 9, 16]
    _, indptr2, indices2, last2, _, _ = make_paged(kv_lens2, ps, hk, d, "NHD", spare=8)
    indices2 = (indices2 + 3) % cache.shape[0]
    qo2 = torch.tensor([0, 2, 7, 12], dtype=torch.int32)
    bufs["paged_kv_indices_buf"][:indices2.shape[0]] = indices2
    items = {}
    if multi_item:  # request 1: prefix 4, then items of 2 and 3 tokens (delimiters at 0)
        table = torch.zeros(3, 16, dtype=torch.int64)
        table[1, :5] = torch.tensor([0, 1, 2, 0, 1])
        items = dict(prefix_len_ptr=torch.tensor([5, 4, 16], dtype=torch.uint32),
                     token_pos_in_items_ptr=table.flatten().to(torch.uint16),
                     token_pos_in_items_len=16,
                     max_item_len_ptr=torch.tensor([0, 2, 0], dtype=torch.uint16))
        for name, value in items.items():
            setattr(w, "_" + name, value)
    kv_lens = torch.tensor(kv_lens2, dtype=torch.int32)
    w._cached_module.plan(ws(), None, None, qo2, indptr2, kv_lens, 12, 3, hq, hk, ps, True, d, d,
                          True, -1, -1, False, 0)
    q = torch.randn(12, hq, d)
    want = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws())
    want.plan(qo2, indptr2, indices2, last2, hq, hk, d, ps, causal=True, sm_scale=0.3,
              logits_soft_cap=7.0, q_data_type=torch.float32, **items)
    torch.testing.assert_close(w.run(q, cache), want.run(q, cache), rtol=0, atol=0)
    with pytest.raises(TypeError, match="prefill"):
        w._cached_module.plan(1, 2, 3)
