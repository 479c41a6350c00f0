"""MoE dispatch decisions on simulated SMs (no GPU needed) and on the CPU.

fused_moe rule (dispatch_rules/fused_moe.toml, H200 2026-11-30): triton (verified on SM 9.0) first
wherever its record and check allow, torch (per-expert GEMMs) next, the float64 reference last;
torch stays for fp8 experts below SM 8.9, which triton refuses; the CPU takes the reference first
(torch's per-expert matmuls run in bf16 / fp16, emulated on CPUs without those instructions).
"""

import pytest

from flashinfer.optional_packages import import_error
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
    fp8 = weight == E4M3
    if sm == "7.5":
        assert decision.backend == "reference"
        assert decision.order == ("reference",)
        assert _reasons(decision, "torch") == {"sm"}
        assert _reasons(decision, "triton") == {"sm"}
    elif sm == "cpu":  # the reference first (torch's bf16 / fp16 CPU matmuls); triton only
        assert decision.backend == "reference"  # under TRITON_INTERPRET
        assert decision.order == ("reference", "torch")
        assert _reasons(decision, "triton") == {"device"}
    elif fp8 and sm in ("8.0", "8.6"):  # triton's fp8 conversions need SM 8.9 (adapter check)
        assert decision.backend == "torch"
        assert decision.order == ("torch", "reference")
        assert _reasons(decision, "triton") == {"sm"}
    else:  # triton's sorted/padded fused MoE leads, torch's per-expert GEMMs next
        assert decision.backend == "triton"
        assert decision.order == ("triton", "torch", "reference")
        assert _reasons(decision, "triton") == set()
        assert _reasons(decision, "torch") == set()
    # trtllm-gen is declared for Blackwell (SM 10.x) only, and never chosen: it is planned (the
    # record documents what it would serve; no kernel is wired)
    trtllm = _reasons(decision, "trtllm")
    assert "planned" in trtllm
    if sm == "10.0":
        fp16 = "float16" in (weight, hidden)
        assert trtllm == ({"planned", "dtype.hidden", "dtype.weight"} if fp16 else {"planned"})
    else:
        assert "sm" in trtllm or "device" in trtllm


def test_trtllm_needs_tensorrt_llm_when_not_assumed():
    """Without assume_installed the real imports decide: trtllm says tensorrt_llm is missing;
    triton leads where it imports, else torch (which needs no vendor package)."""
    decision = select(_moe("10.0"))
    reasons = [r for c in decision.candidates if c.backend == "trtllm" for r in c.reasons]
    assert [r.field for r in reasons] == ["planned", "import"]
    assert "tensorrt_llm" in reasons[1].message
    assert decision.backend == ("triton" if import_error("triton") is None else "torch")
    assert decision.order[-2:] == ("torch", "reference")


@pytest.mark.parametrize("sm", SMS)
def test_fp4_weights_have_no_backend(sm):
    """FP4 (uint8-packed) weights: only trtllm-gen on SM 10.x would serve them, and it is
    planned only, so every device says why no backend can."""
    problem = _moe(sm, "uint8", "bfloat16")
    with pytest.raises(NoBackendError) as info:
        select(problem, assume_installed=True)
    if sm == "10.0":
        assert _reasons(info.value, "trtllm") == {"planned"}
    assert _reasons(info.value, "reference") == {"dtype.weight"}
    assert _reasons(info.value, "torch") >= {"dtype.weight"}
