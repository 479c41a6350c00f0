"""MoE dispatch decisions on simulated SMs (no GPU needed) and on the CPU."""

import pytest

from flashinfer.device import simulated
from flashinfer.dispatch import NoBackendError, Problem, select

SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]
E4M3 = "float8_e4m3fn"


def _device(sm):
    return simulated(None if sm == "cpu" else sm)


def _moe(sm, weight="bfloat16", hidden="bfloat16", features=(), **shape):
    facts = {"num_tokens": 1024, "hidden_size": 7168, "intermediate_size": 2048,
             "num_experts": 256, "top_k": 8, **shape}
    return Problem.make("fused_moe", _device(sm),
                        dtypes={"hidden": hidden, "weight": weight, "out": "bfloat16"},
                        shape=facts, features=features)


def _reasons(decision_or_error, name):
    return {r.field for c in decision_or_error.candidates if c.name == name for r in c.reasons}


@pytest.mark.parametrize("sm", SMS)
def test_routing_prefers_torch_everywhere(sm):
    problem = Problem.make("moe_routing", _device(sm), dtypes={"logits": "float32"},
                           shape={"num_tokens": 128, "num_experts": 256, "top_k": 8},
                           features=["bias", "grouped_topk"])
    decision = select(problem, assume_installed=True)
    assert decision.backend == "torch"
    assert decision.order == ("torch", "reference")


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("features,weight,hidden", [
    ((), "bfloat16", "bfloat16"),
    (("fp8_block_scale",), E4M3, E4M3),
    (("fp8_per_tensor", "scales_on_input"), E4M3, E4M3),
    (("geglu",), "float16", "float16"),
])
def test_fused_moe(sm, features, weight, hidden):
    decision = select(_moe(sm, weight, hidden, features), assume_installed=True)
    if sm == "7.5":
        assert decision.backend == "reference"
        assert _reasons(decision, "torch") == {"sm"}
    else:  # per-expert torch.mm (cuBLAS / CPU BLAS); fp8 experts are dequantised first
        assert decision.backend == "torch"
    # trtllm-gen is declared for Blackwell (SM 10.x) only, and never chosen: its adapter is
    # not wired (the record documents what it would serve)
    trtllm = _reasons(decision, "trtllm")
    if sm == "10.0":
        fp16 = "float16" in (weight, hidden)
        assert trtllm == ({"dtype.hidden", "dtype.weight"} if fp16 else {"adapter"})
    else:
        assert "sm" in trtllm or "device" in trtllm


def test_trtllm_needs_tensorrt_llm_when_not_assumed():
    decision = select(_moe("10.0"))
    reasons = [r for c in decision.candidates if c.backend == "trtllm" for r in c.reasons]
    assert [r.field for r in reasons] == ["import"] and "tensorrt_llm" in reasons[0].message
    assert decision.backend == "torch"


@pytest.mark.parametrize("sm", SMS)
def test_fp4_weights_have_no_backend(sm):
    """FP4 (uint8-packed) weights: only trtllm-gen on SM 10.x would serve them, and its adapter
    is not wired, so every device says why no backend can."""
    problem = _moe(sm, "uint8", "bfloat16")
    with pytest.raises(NoBackendError) as info:
        select(problem, assume_installed=True)
    if sm == "10.0":
        assert _reasons(info.value, "trtllm") == {"adapter"}
    assert _reasons(info.value, "reference") == {"dtype.weight"}
    assert _reasons(info.value, "torch") >= {"dtype.weight"}
