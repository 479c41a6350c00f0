"""torch:flash_varlen planner for batch_prefill_ragged (aten FA2 varlen over the whole batch).

On CPU, ``torch_native.aten_flash`` is replaced by a float64 emulation of the aten op's varlen
form (the same FlashAttention mask semantics as attention_helpers.py's emulation, reached
through aten's argument convention), and the runner must match the naive batch computation.
On a GPU the real op runs against a float32 computation, eagerly and replayed from a CUDA graph.
"""

import pytest
import torch

from attention_helpers import (SMS, assert_lse_close, candidate, emulated_varlen, make_plan,
                               naive_batch, ragged_inputs, ragged_problem, run_planner)
from conftest import capture_cuda_graph, TOLERANCE, poison, rel_error
from flashinfer.backends.torch import attention as torch_native
from flashinfer.attention.batch_params import KVInput, RunScales
from flashinfer.dispatch import kernel_for, select

PLANNER = kernel_for("torch", "batch_prefill_ragged", "flash_varlen")


@pytest.fixture
def calls(monkeypatch):
    log = []

    def fake_aten(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
                  scale=None, window_size_left=None, window_size_right=None, seqused_k=None,
                  alibi_slopes=None):
        assert dropout_p == 0.0 and not return_debug_mask
        assert seqused_k is None and alibi_slopes is None and window_size_right is None
        left = -1 if window_size_left is None else window_size_left
        out, lse = emulated_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale,
                                   causal=is_causal, window=(left, -1), softcap=0.0, calls=log)
        empty = torch.empty(0)
        return out, lse, empty, empty, empty
    monkeypatch.setattr(torch_native, "aten_flash", fake_aten)
    return log


@pytest.mark.parametrize("qo_lens, kv_lens, kw", [
    ([5, 1, 7], [5, 9, 12], {}),
    ([4, 6, 3], [4, 10, 2], {"causal": True}),
    ([3, 8], [11, 8], {"causal": True, "window_left": 3}),
    ([2, 3], [0, 5], {}),
    ([3, 4], [7, 4], {"num_qo_heads": 6, "num_kv_heads": 1, "causal": True}),
    ([3, 4], [7, 4], {"num_qo_heads": 2, "num_kv_heads": 2}),
])
@pytest.mark.parametrize("hnd", [False, True])
def test_ragged_plumbing(qo_lens, kv_lens, kw, hnd, calls):
    plan = make_plan(qo_lens, kv_lens, **kw)
    q, k, v = ragged_inputs(plan, hnd=hnd)
    out, lse = run_planner(PLANNER, plan, q, k, v)
    want_out, want_lse = naive_batch(q, k, v, qo_lens, kv_lens, sm_scale=plan.sm_scale,
                                     causal=plan.causal, window_left=plan.window_left)
    assert rel_error(out, want_out) < TOLERANCE[torch.float32]
    assert_lse_close(lse, want_lse, TOLERANCE[torch.float32])
    (call,) = calls
    assert call["cu_q"] is plan.qo_indptr and call["cu_k"] is plan.kv_indptr
    assert (call["max_q"], call["max_k"]) == (plan.max_qo_len, plan.max_kv_len)
    assert call["causal"] == plan.causal


def test_ragged_scales_output_dtype_no_lse(calls):
    plan = make_plan([4, 3], [6, 3], causal=True, o_dtype=torch.float64)
    q, k, v = ragged_inputs(plan, seed=1)
    scales = RunScales(q_scale=2.0, k_scale=0.5, v_scale=3.0)
    out, lse = run_planner(PLANNER, plan, q, k, v, lse=False, scales=scales)
    want, _ = naive_batch(q, k, v, [4, 3], [6, 3], sm_scale=plan.sm_scale, causal=True,
                          q_scale=2.0, k_scale=0.5, v_scale=3.0)
    assert lse is None and out.dtype == torch.float64
    assert rel_error(out, want) < TOLERANCE[torch.float32]
    assert calls[0]["scale"] == pytest.approx(plan.sm_scale)


def test_window_beyond_every_request_is_not_passed(calls):
    plan = make_plan([3, 2], [5, 4], causal=True, window_left=5)
    q, k, v = ragged_inputs(plan, seed=2)
    out, _ = run_planner(PLANNER, plan, q, k, v)
    want, _ = naive_batch(q, k, v, [3, 2], [5, 4], sm_scale=plan.sm_scale, causal=True)
    assert rel_error(out, want) < TOLERANCE[torch.float32]
    assert calls[0]["window"] == (-1, -1)


# --- decisions on simulated SMs -------------------------------------------------------------

@pytest.mark.parametrize("sm", SMS)
def test_record_per_sm(sm, monkeypatch):
    monkeypatch.setattr(torch_native, "schema_arguments",
                        lambda op: frozenset({"scale", "window_size_left"}))
    d = select(ragged_problem(sm, features=("causal", "gqa", "window", "lse")),
               assume_installed=True)
    cand = candidate(d, "torch:flash_varlen")
    ok = sm is not None and sm != "7.5"
    assert cand.usable == ok
    if not ok:
        assert {r.field for r in cand.reasons} == {"device" if sm is None else "sm"}


@pytest.mark.parametrize("features, field", [
    (("window",), "feature"),  # a window only with causal
    (("causal", "soft_cap"), "feature"),
    (("causal", "fp8_kv"), "feature"),
    (("causal", "head_dim_differs"), "feature"),
    (("causal", "sinks"), "feature"),
])
def test_rejections(features, field, monkeypatch):
    monkeypatch.setattr(torch_native, "schema_arguments",
                        lambda op: frozenset({"scale", "window_size_left"}))
    d = select(ragged_problem("9.0", features=features, head_dim_vo=64), assume_installed=True)
    assert {r.field for r in candidate(d, "torch:flash_varlen").reasons} == {field}


def test_schema_without_window_argument(monkeypatch):
    monkeypatch.setattr(torch_native, "schema_arguments", lambda op: frozenset({"scale"}))
    d = select(ragged_problem("9.0", features=("causal", "window")), assume_installed=True)
    reasons = candidate(d, "torch:flash_varlen").reasons
    assert [(r.field, r.actual) for r in reasons] == [("torch_op", "window_size_left")]


# --- GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("qo_lens, kv_lens, kw", [
    ([1, 17, 128, 300], [1, 40, 128, 513], {"causal": True}),
    ([64, 33], [64, 200], {}),
    ([200, 50], [100, 60], {"causal": True}),
    ([129, 7], [300, 7], {"causal": True, "window_left": 31}),
])
def test_gpu_ragged(dtype, qo_lens, kv_lens, kw):
    plan = make_plan(qo_lens, kv_lens, num_qo_heads=8, num_kv_heads=2, head_dim_qk=128,
                     dtype=dtype, device="cuda", **kw)
    q, k, v = ragged_inputs(plan, hnd=True)
    out, lse = run_planner(PLANNER, plan, q, k, v, scales=RunScales(k_scale=0.8, v_scale=1.5))
    want_out, want_lse = naive_batch(q.cpu().float(), k.cpu().float(), v.cpu().float(), qo_lens,
                                     kv_lens, sm_scale=plan.sm_scale, causal=plan.causal,
                                     window_left=plan.window_left, k_scale=0.8, v_scale=1.5)
    assert rel_error(out.cpu(), want_out) < TOLERANCE[dtype]
    assert_lse_close(lse.cpu(), want_lse.float(), TOLERANCE[dtype])


@pytest.mark.gpu
def test_gpu_ragged_cuda_graph_replay():
    lens_q, lens_k = [100, 3, 250], [300, 40, 250]
    plan = make_plan(lens_q, lens_k, num_qo_heads=8, num_kv_heads=2, head_dim_qk=128,
                     dtype=torch.bfloat16, device="cuda", causal=True, cuda_graph=True)
    runner = PLANNER(plan)
    q, k, v = ragged_inputs(plan, seed=5)
    out = torch.empty(plan.total_qo, 8, 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(plan.total_qo, 8, device="cuda")
    graph = capture_cuda_graph(lambda: runner(q, KVInput(k, v), out, lse, RunScales()))
    for seed in (6, 7):
        q2, k2, v2 = ragged_inputs(plan, seed=seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        poison(out), poison(lse)
        graph.replay()
        eager_out, eager_lse = run_planner(PLANNER, plan, q2, k2, v2)
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
        want, _ = naive_batch(q2.cpu().float(), k2.cpu().float(), v2.cpu().float(), lens_q,
                              lens_k, sm_scale=plan.sm_scale, causal=True)
        assert rel_error(out.cpu(), want) < TOLERANCE[torch.bfloat16]
