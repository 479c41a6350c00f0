"""Fuzz suite, fused MoE (``cutlass_fused_moe``, routing given): generated calls with one expert
id wrong (past ``E_local * ep_size`` or negative) must raise a ValueError naming
``token_selected_experts[t, j]``, its value and the allowed range before anything is written
(ids on the CPU, or FLASHINFER_CHECK_INDICES=1); with the ids on a GPU (and for each backend's
kernel called directly on the CPU) the bad pair is skipped, contributes nothing, and the first one
is left in the error record, raised by ``flashinfer.check_errors()``. Valid calls, ids of other
expert-parallel ranks included (skipped by design), must match float64 naive math; a non-finite
routing weight makes its token's row non-finite and no other.

CPU: every backend serving the op here (reference, torch, Triton in its interpreter) at tiny
shapes. GPU (marker ``gpu``): the same generated calls over every backend usable on the device.
The trtllm_* entry points route internally (ids always in range) and are not fuzzed here."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import flashinfer
from flashinfer import index_checks
from flashinfer.dispatch import kernel_for
from flashinfer.dispatch import Problem
from flashinfer.fused_moe import ActivationType, cutlass_fused_moe
from flashinfer.fused_moe.checks import EXPERT_IDS
from flashinfer.fused_moe.core import ExpertSpec

from conftest import FUZZ, FUZZ_SLOW, HAS_CUDA, raises_naming, rel_error, usable_backends


SENTINEL = 12345.0  # the rows around an output; a stray write changes them
TOL = 2e-2  # bf16 inputs, bf16 intermediates in the fast kernels, float32 output
ACTIVATIONS = {int(ActivationType.Swiglu): "silu", int(ActivationType.Geglu): "gelu"}


def _backends(device: str) -> list[str]:
    if device == "cuda" and not HAS_CUDA:
        return ["reference", "torch", "triton"]  # collected, then skipped by the gpu marker
    problem = Problem.make("fused_moe", torch.device(device),
                           dtypes={"hidden": torch.bfloat16, "weight": torch.bfloat16,
                                   "out": torch.float32},
                           shape={"num_tokens": 4, "hidden_size": 32, "intermediate_size": 32,
                                  "num_experts": 4, "top_k": 2})
    return usable_backends(problem)


CPU_BACKENDS, GPU_BACKENDS = _backends("cpu"), _backends("cuda")


# --------------------------------------------------------------------------------------------
# generated cases


@st.composite
def moe_cases(draw, bad: bool, max_tokens: int = 4):
    """A valid call (global ids over every rank's experts), then, when ``bad``, one id made one
    that no rank owns: ``(t, j)`` and its value."""
    e_local = draw(st.sampled_from([1, 2, 4]))
    ep_size = draw(st.integers(1, 3))
    tokens, top_k = draw(st.integers(1, max_tokens)), draw(st.integers(1, 3))
    total = e_local * ep_size
    case = {
        "tokens": tokens, "top_k": top_k, "e_local": e_local, "ep_size": ep_size,
        "ep_rank": draw(st.integers(0, ep_size - 1)),
        "hidden": draw(st.sampled_from([16, 32])), "inter": draw(st.sampled_from([16, 32])),
        "activation": draw(st.sampled_from(sorted(ACTIVATIONS))),
        "seed": draw(st.integers(0, 1 << 16)),
        "ids": [[draw(st.integers(0, total - 1)) for _ in range(top_k)] for _ in range(tokens)],
        "bad": None,
    }
    if bad:
        t, j = draw(st.integers(0, tokens - 1)), draw(st.integers(0, top_k - 1))
        extra = draw(st.integers(0, 1000))
        value = draw(st.sampled_from([total + extra, -1 - extra]))
        case["ids"][t][j] = value
        case["bad"] = (t, j, value)
    return case


def _tensors(case, device):
    g = torch.Generator().manual_seed(case["seed"])
    t, h, i, e = case["tokens"], case["hidden"], case["inter"], case["e_local"]
    x = torch.randn(t, h, generator=g).to(torch.bfloat16)
    w1 = (torch.randn(e, 2 * i, h, generator=g) / h ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g) / i ** 0.5).to(torch.bfloat16)
    weights = torch.rand(t, case["top_k"], generator=g) + 0.1
    ids = torch.tensor(case["ids"], dtype=torch.int32)
    return [a.to(device) for a in (x, ids, weights, w1, w2)]


def _naive(case, x, ids, weights, w1, w2) -> torch.Tensor:
    """float64 loops: the pairs routed to this rank's experts, every other pair (other ranks',
    ids no rank owns) contributing nothing."""
    device = x.device
    x, weights, w1, w2 = (a.double().cpu() for a in (x, weights, w1, w2))
    act = torch.nn.functional.silu if ACTIVATIONS[case["activation"]] == "silu" else \
        torch.nn.functional.gelu
    out = torch.zeros(case["tokens"], case["hidden"], dtype=torch.float64)
    first = case["ep_rank"] * case["e_local"]
    for t, row in enumerate(ids.tolist()):
        for j, gid in enumerate(row):
            e = gid - first
            if not 0 <= e < case["e_local"]:
                continue
            h = w1[e] @ x[t]
            up, gate = h[:case["inter"]], h[case["inter"]:]
            out[t] += weights[t, j] * (w2[e] @ (act(gate) * up))
    return out.to(device)


def _call(case, x, ids, weights, w1, w2, backend, output=None):
    return cutlass_fused_moe(x, ids, weights, w1, w2, torch.float32, [],
                             ep_size=case["ep_size"], ep_rank=case["ep_rank"], output=output,
                             activation_type=case["activation"], backend=backend)[0]


def _embedded_out(case, device):
    """``(buffer, out)``: a NaN-poisoned output with a SENTINEL row before and after it."""
    big = torch.full((case["tokens"] + 2, case["hidden"]), SENTINEL, dtype=torch.float32,
                     device=device)
    out = big[1:-1]
    out.fill_(float("nan"))
    return big, out


def _words(case):
    t, j, value = case["bad"]
    total = case["e_local"] * case["ep_size"]
    return ("cutlass_fused_moe", f"token_selected_experts[{t}, {j}] = {value}", f"[0, {total})")


def _device_words(case):
    t, j, value = case["bad"]
    return ("cutlass_fused_moe",
            f"token_selected_experts[{t * case['top_k'] + j}] = {value}", "t * top_k + j")


def _sentinel_rows_intact(big) -> bool:
    return bool((big[0] == SENTINEL).all() and (big[-1] == SENTINEL).all())


# --------------------------------------------------------------------------------------------
# CPU


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@FUZZ_SLOW
@given(case=moe_cases(bad=False))
def test_valid_calls_match_float64(backend, case):
    args = _tensors(case, "cpu")
    big, out = _embedded_out(case, "cpu")
    got = _call(case, *args, backend, output=out)
    assert got is out and _sentinel_rows_intact(big)
    assert rel_error(out, _naive(case, *args)) < TOL


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@FUZZ
@given(case=moe_cases(bad=True))
def test_bad_expert_id_raises_naming_the_entry_and_writes_nothing(backend, case):
    args = _tensors(case, "cpu")
    big, out = _embedded_out(case, "cpu")
    with raises_naming(*_words(case)):
        _call(case, *args, backend, output=out)
    assert out.isnan().all() and _sentinel_rows_intact(big)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@FUZZ_SLOW
@given(case=moe_cases(bad=True))
def test_kernel_skips_bad_ids_and_records_them(backend, case):
    """Each backend's kernel itself (the GPU path: no host check in front of it), on the CPU."""
    index_checks.clear()  # per example (the fixture runs once per test)
    x, ids, weights, w1, w2 = _tensors(case, "cpu")
    total = case["e_local"] * case["ep_size"]
    spec = ExpertSpec("none", case["activation"], case["ep_rank"] * case["e_local"], False,
                      total, EXPERT_IDS)
    big, out = _embedded_out(case, "cpu")
    name, _, variant = backend.partition(":")
    kernel_for(name, "fused_moe", variant or "default")(x, None, w1, None, w2, None, ids,
                                                        weights, spec, out)
    assert _sentinel_rows_intact(big) and not out.isnan().any()
    assert rel_error(out, _naive(case, x, ids, weights, w1, w2)) < TOL
    with raises_naming(*_device_words(case), "skipped"):
        flashinfer.check_errors()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@settings(FUZZ, max_examples=4)
@given(case=moe_cases(bad=False), value=st.sampled_from([float("nan"), float("inf")]),
       data=st.data())
def test_nonfinite_routing_weight_poisons_only_its_row(backend, case, value, data):
    x, ids, weights, w1, w2 = _tensors(case, "cpu")
    first = case["ep_rank"] * case["e_local"]
    local = [(t, j) for t, row in enumerate(case["ids"]) for j, gid in enumerate(row)
             if 0 <= gid - first < case["e_local"]]
    if not local:
        return
    t, j = data.draw(st.sampled_from(local))
    weights[t, j] = value
    got = _call(case, x, ids, weights, w1, w2, backend)
    assert not got[t].isfinite().any()
    rest = [r for r in range(case["tokens"]) if r != t]
    want = _naive(case, x, ids, weights, w1, w2)
    assert got[rest].isfinite().all() and rel_error(got[rest], want[rest]) < TOL


@pytest.mark.parametrize("tokens", [5, 70])  # 10 pairs: one program; 140: three launches
def test_triton_alignment_reports_the_lowest_bad_pair_and_counts_all(tokens):
    """``prepare`` alone (the launch that checks the ids), in the interpreter on the CPU: the
    record names the lowest bad pair and counts every bad one, across alignment chunks."""
    pytest.importorskip("triton")
    from flashinfer.backends.triton.moe import prepare

    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, 8, (tokens, 2), dtype=torch.int32, generator=g)
    bad = [(tokens - 1, 1, 8), (tokens // 2, 0, -4), (tokens // 2 + 1, 1, 300)]
    for t, j, value in bad:
        ids[t, j] = value
    sorted_pairs, _, num_blocks, _, _ = prepare(
        ids, 4, 4, 16, check=(index_checks.record(ids.device), 8, EXPERT_IDS.code))
    used = sorted_pairs[: int(num_blocks) * 16].long()
    real = used[used < ids.numel()]  # the pairs listed (padding holds ids.numel())
    local = (ids.reshape(-1) >= 4) & (ids.reshape(-1) < 8)
    assert sorted(real.tolist()) == local.nonzero().flatten().tolist()  # bad pairs left out
    first = (tokens // 2) * 2
    with raises_naming(f"token_selected_experts[{first}] = -4", "(3 bad entries"):
        flashinfer.check_errors()


def test_ids_of_other_ranks_are_skipped_without_a_fault():
    """Ids inside [0, E_local * ep_size) but outside this rank's range are not errors."""
    torch.manual_seed(3)
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    w1 = torch.randn(2, 32, 16, dtype=torch.bfloat16)
    w2 = torch.randn(2, 16, 16, dtype=torch.bfloat16)
    ids = torch.tensor([[4, 5], [0, 1]], dtype=torch.int32)  # rank 1 of 3 owns 2 and 3
    for backend in CPU_BACKENDS:
        out = cutlass_fused_moe(x, ids, torch.ones(2, 2), w1, w2, torch.float32, [], ep_size=3,
                                ep_rank=1, backend=backend)[0]
        assert (out == 0).all()
    flashinfer.check_errors()


# --------------------------------------------------------------------------------------------
# GPU: the ids on the device, every backend of the op


GPU_FUZZ = settings(FUZZ, max_examples=30)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@GPU_FUZZ
@given(case=moe_cases(bad=False, max_tokens=80))
def test_gpu_valid_calls_match_float64(backend, case):
    index_checks.clear()  # per example (the fixture runs once per test)
    args = _tensors(case, "cuda")
    big, out = _embedded_out(case, "cuda")
    _call(case, *args, backend, output=out)
    assert _sentinel_rows_intact(big)
    assert rel_error(out, _naive(case, *args)) < TOL
    flashinfer.check_errors()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@GPU_FUZZ
@given(case=moe_cases(bad=True, max_tokens=80))
def test_gpu_bad_expert_id_is_skipped_recorded_and_raised_later(backend, case):
    index_checks.clear()  # per example (the fixture runs once per test)
    args = _tensors(case, "cuda")
    big, out = _embedded_out(case, "cuda")
    _call(case, *args, backend, output=out)  # no synchronisation, no exception here
    with raises_naming(*_device_words(case)):
        flashinfer.check_errors()
    assert _sentinel_rows_intact(big) and not out.isnan().any()
    assert rel_error(out, _naive(case, *args)) < TOL  # the bad pair contributed nothing


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@FUZZ
@given(case=moe_cases(bad=True))
def test_gpu_check_indices_env_raises_at_the_call(backend, case, monkeypatch):
    monkeypatch.setenv("FLASHINFER_CHECK_INDICES", "1")
    args = _tensors(case, "cuda")
    big, out = _embedded_out(case, "cuda")
    with raises_naming(*_words(case)):
        _call(case, *args, backend, output=out)
    assert out.isnan().all() and _sentinel_rows_intact(big)
    index_checks.check_errors()  # nothing was recorded


@pytest.mark.gpu
def test_gpu_bad_expert_id_inside_a_cuda_graph():
    """The Triton path runs without a host sync: captured once, a replay with a bad id still
    skips and records it."""
    from conftest import capture_cuda_graph

    dev = torch.device("cuda")
    torch.manual_seed(5)
    x = torch.randn(8, 64, device=dev, dtype=torch.bfloat16)
    w1 = torch.randn(4, 128, 64, device=dev, dtype=torch.bfloat16) * 0.1
    w2 = torch.randn(4, 64, 64, device=dev, dtype=torch.bfloat16) * 0.1
    ids = torch.randint(0, 4, (8, 2), device=dev, dtype=torch.int32)
    weights = torch.rand(8, 2, device=dev)
    out = torch.empty(8, 64, device=dev, dtype=torch.bfloat16)
    graph = capture_cuda_graph(lambda: cutlass_fused_moe(x, ids, weights, w1, w2, torch.bfloat16,
                                                         [], output=out, backend="triton"))
    flashinfer.check_errors()
    ids[3, 1] = 9
    graph.replay()
    with raises_naming("token_selected_experts[7] = 9"):
        flashinfer.check_errors()
    want = cutlass_fused_moe(x, ids.clamp_max(3).masked_fill(ids > 3, 0), weights.masked_fill(
        ids > 3, 0.0), w1, w2, torch.bfloat16, [], backend="reference")[0]
    assert rel_error(out, want) < 1e-2
