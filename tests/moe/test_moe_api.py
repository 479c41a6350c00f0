"""Fused MoE public API: validation, return conventions, out=, FP4 refusal, torch.compile."""

import pytest
import torch

import flashinfer
from conftest import poison, rel_error
from flashinfer.dispatch import BackendUnavailableError
from flashinfer.fused_moe import (ActivationType, RoutingMethodType, WeightLayout,
                                  cutlass_fused_moe, is_gated_activation, trtllm_bf16_moe,
                                  trtllm_fp4_block_scale_moe, trtllm_fp8_block_scale_moe,
                                  trtllm_fp8_per_tensor_scale_moe)

M, E, H, I, K = 5, 4, 32, 16, 2


def test_enums_use_upstream_numbering():
    assert [(m.name, int(m)) for m in RoutingMethodType] == [
        ("Default", 0), ("Renormalize", 1), ("DeepSeekV3", 2), ("Llama4", 3),
        ("RenormalizeNaive", 4), ("TopK", 5), ("SigmoidRenorm", 6), ("MiniMax2", 7),
        ("Sigmoid", 8), ("TopKSigmoid", 9), ("Unspecified", 10)]
    assert [(m.name, int(m)) for m in ActivationType] == [
        ("Gelu", 0), ("Relu", 1), ("Silu", 2), ("Swiglu", 3), ("Geglu", 4), ("SwigluBias", 5),
        ("Relu2", 6), ("SwigluStep", 7), ("GegluTanh", 8), ("Identity", 9), ("Situ", 10),
        ("InvalidType", 11)]
    assert is_gated_activation(ActivationType.Swiglu) and not is_gated_activation(1)
    assert flashinfer.RoutingMethodType is RoutingMethodType
    assert flashinfer.cutlass_fused_moe is cutlass_fused_moe


def _cutlass_args(dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    return dict(input=torch.randn(M, H).to(dtype),
                token_selected_experts=torch.randint(0, E, (M, K), dtype=torch.int32),
                token_final_scales=torch.rand(M, K),
                fc1_expert_weights=(torch.randn(E, 2 * I, H) * 0.2).to(dtype),
                fc2_expert_weights=(torch.randn(E, H, I) * 0.2).to(dtype),
                output_dtype=dtype, quant_scales=[])


def _bf16_args(seed=0):
    torch.manual_seed(seed)
    return dict(routing_logits=torch.randn(M, E), routing_bias=None,
                hidden_states=torch.randn(M, H).bfloat16(),
                gemm1_weights=(torch.randn(E, 2 * I, H) * 0.2).bfloat16(),
                gemm2_weights=(torch.randn(E, H, I) * 0.2).bfloat16(), num_experts=E, top_k=K,
                n_group=None, topk_group=None, intermediate_size=I, local_expert_offset=0,
                local_num_experts=E, use_shuffled_weight=False, weight_layout=WeightLayout.MajorK)


def test_return_conventions_and_output_in_place():
    res = cutlass_fused_moe(**_cutlass_args())
    assert isinstance(res, list) and len(res) == 1 and res[0].shape == (M, H)
    out = poison(torch.empty(M, H, dtype=torch.bfloat16))
    assert cutlass_fused_moe(**_cutlass_args(), output=out)[0] is out
    assert rel_error(out, res[0]) == 0
    out2 = poison(torch.empty(M, H, dtype=torch.bfloat16))
    got = trtllm_bf16_moe(**_bf16_args(), output=out2)
    assert isinstance(got, torch.Tensor) and got is out2 and not got.isnan().any()


def test_backends_agree_and_cutlass_spelling_means_auto():
    a = cutlass_fused_moe(**_cutlass_args(torch.float32), backend="reference")[0]
    b = cutlass_fused_moe(**_cutlass_args(torch.float32), backend="cutlass")[0]
    assert rel_error(b, a) < 1e-5


def test_replay_records_the_routing():
    replay = torch.full((M + 2, K), -1, dtype=torch.int16)
    trtllm_bf16_moe(**_bf16_args(), routing_method_type=RoutingMethodType.Renormalize,
                    routing_replay_out=replay)
    logits = _bf16_args()["routing_logits"]
    ids = logits.sort(dim=-1, descending=True, stable=True).indices[:, :K]
    assert torch.equal(replay[:M].long(), ids) and (replay[M:] == -1).all()


@pytest.mark.parametrize("change,exc,match", [
    ({"input": torch.randn(M, H, 2)}, ValueError, "input"),
    ({"input": torch.randint(0, 3, (M, H))}, ValueError, "input"),
    ({"fc1_expert_weights": torch.randn(E, 2 * I + 1, H).bfloat16()}, ValueError,
     "fc1_expert_weights"),
    ({"fc2_expert_weights": torch.randn(E, H, I + 1).bfloat16()}, ValueError,
     "fc2_expert_weights"),
    ({"fc2_expert_weights": torch.randn(E, H, I).half()}, ValueError, "fc2_expert_weights"),
    ({"token_selected_experts": torch.zeros(M, K, dtype=torch.int64)}, ValueError,
     "token_selected_experts"),
    ({"token_final_scales": torch.rand(M, K + 1)}, ValueError, "token_final_scales"),
    ({"token_final_scales": torch.rand(M, K).bfloat16()}, ValueError, "token_final_scales"),
    ({"output_dtype": torch.int32}, ValueError, "output_dtype"),
    ({"output": torch.empty(M, H)}, ValueError, "output"),
    ({"quant_scales": [torch.ones(E)]}, ValueError, "quant_scales"),
    ({"activation_type": ActivationType.Relu2}, ValueError, "activation_type"),
    ({"activation_type": 99}, ValueError, "activation_type"),
    ({"fc1_expert_biases": torch.zeros(E, 2 * I)}, ValueError, "fc1_expert_biases"),
    ({"swiglu_alpha": torch.ones(E)}, ValueError, "swiglu_alpha"),
    ({"min_latency_mode": True}, ValueError, "min_latency_mode"),
    ({"enable_alltoall": True}, ValueError, "enable_alltoall"),
    ({"ep_size": 2, "ep_rank": 2}, ValueError, "ep_rank"),
    ({"use_deepseek_fp8_block_scale": True}, ValueError, "fc1_expert_weights"),
    ({"backend": "cake"}, ValueError, "cake"),
    ({"backend": "nope"}, ValueError, "nope"),
])
def test_cutlass_validation(change, exc, match):
    args = {**_cutlass_args(), **change}
    with pytest.raises(exc, match=match):
        cutlass_fused_moe(**args)


@pytest.mark.parametrize("change,match", [
    ({"use_shuffled_weight": True}, "use_shuffled_weight"),
    ({"weight_layout": WeightLayout.BlockMajorK}, "weight_layout"),
    ({"intermediate_size": I + 1}, "intermediate_size"),
    ({"local_num_experts": E - 1}, "local_num_experts"),
    ({"local_expert_offset": 1}, "local_expert_offset"),
    ({"num_experts": E + 1}, "routing_logits"),
    ({"do_finalize": False}, "do_finalize"),
    ({"gemm1_alpha": torch.ones(E)}, "gemm1_alpha"),
    ({"hidden_states": torch.randn(M, H).half()}, "hidden_states"),
    ({"routing_method_type": 10}, "routing_method_type"),
    ({"routing_method_type": RoutingMethodType.DeepSeekV3}, "routing_bias"),
    ({"routing_replay_out": torch.empty(M, K, dtype=torch.int32)}, "routing_replay_out"),
])
def test_trtllm_bf16_validation(change, match):
    with pytest.raises(ValueError, match=match):
        trtllm_bf16_moe(**{**_bf16_args(), **change})


def test_upstream_default_layout_is_rejected_with_a_remedy():
    args = _bf16_args()
    del args["use_shuffled_weight"], args["weight_layout"]
    with pytest.raises(ValueError, match="use_shuffled_weight=False"):
        trtllm_bf16_moe(**args)


def _fp8_block_args():
    torch.manual_seed(1)
    hid, inter = 128, 128
    return dict(routing_logits=torch.randn(M, E), routing_bias=None,
                hidden_states=torch.randn(M, hid).to(torch.float8_e4m3fn),
                hidden_states_scale=torch.ones(1, M),
                gemm1_weights=torch.randn(E, 2 * inter, hid).to(torch.float8_e4m3fn),
                gemm1_weights_scale=torch.ones(E, 2, 1),
                gemm2_weights=torch.randn(E, hid, inter).to(torch.float8_e4m3fn),
                gemm2_weights_scale=torch.ones(E, 1, 1), num_experts=E, top_k=K, n_group=None,
                topk_group=None, intermediate_size=inter, local_expert_offset=0,
                local_num_experts=E, routed_scaling_factor=None)


@pytest.mark.parametrize("change,match", [
    ({"hidden_states_scale": torch.ones(M, 1)}, "hidden_states_scale"),
    ({"gemm1_weights_scale": torch.ones(E, 1, 1)}, "gemm1_weights_scale"),
    ({"gemm2_weights_scale": torch.ones(E, 1, 1).double()}, "gemm2_weights_scale"),
    ({"gemm2_weights": torch.randn(E, 128, 128).bfloat16()}, "gemm2_weights"),
    ({"fp8_quantization_type": 2}, "fp8_quantization_type"),
    ({"num_fused_shared_experts": 1}, "num_fused_shared_experts"),
    ({"gemm1_bias": torch.zeros(E, 256)}, "gemm1_bias"),
])
def test_trtllm_fp8_block_validation(change, match):
    with pytest.raises(ValueError, match=match):
        trtllm_fp8_block_scale_moe(**{**_fp8_block_args(), **change})


def test_trtllm_fp8_block_returns_bf16_tensor():
    out = trtllm_fp8_block_scale_moe(**_fp8_block_args())
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == (M, 128)


def test_trtllm_fp8_per_tensor_validation():
    torch.manual_seed(2)
    f8 = torch.float8_e4m3fn
    args = dict(routing_logits=torch.randn(M, E), routing_bias=None,
                hidden_states=torch.randn(M, H).to(f8),
                gemm1_weights=torch.randn(E, 2 * I, H).to(f8),
                output1_scales_scalar=torch.ones(E), output1_scales_gate_scalar=torch.ones(E),
                gemm2_weights=torch.randn(E, H, I).to(f8), output2_scales_scalar=torch.ones(E),
                num_experts=E, top_k=1, n_group=None, topk_group=None, intermediate_size=I,
                local_expert_offset=0, local_num_experts=E, routed_scaling_factor=None,
                use_routing_scales_on_input=True, routing_method_type=RoutingMethodType.Llama4)
    assert trtllm_fp8_per_tensor_scale_moe(**args).shape == (M, H)
    for name, bad in (("output1_scales_scalar", torch.ones(E + 1)),
                      ("output1_scales_gate_scalar", torch.ones(E).half()),
                      ("output2_scales_scalar", torch.ones(1)),
                      ("hidden_states", torch.randn(M, H).bfloat16())):
        with pytest.raises(ValueError, match=name):
            trtllm_fp8_per_tensor_scale_moe(**{**args, name: bad})


def test_fp4_is_refused_naming_the_hardware():
    hidden = torch.randn(M, H).bfloat16()
    w1 = torch.zeros(E, 2 * I, H // 2, dtype=torch.uint8)
    w2 = torch.zeros(E, H, I // 2, dtype=torch.uint8)
    with pytest.raises(BackendUnavailableError, match="SM 10") as info:
        trtllm_fp4_block_scale_moe(torch.randn(M, E), None, hidden, None, w1,
                                   torch.zeros(E, 2 * I, H // 16, dtype=torch.uint8), None, None,
                                   None, None, w2, torch.zeros(E, H, I // 16, dtype=torch.uint8),
                                   None, None, None, None, E, K, None, None, I, 0, E, None)
    assert isinstance(info.value, ValueError)
    assert "trtllm" in str(info.value) and "reference" in str(info.value)


def test_torch_compile_fullgraph_cutlass_fused_moe():
    args = _cutlass_args(torch.float32, seed=3)
    eager = cutlass_fused_moe(**args)[0]

    def fn(x, ids, w, w1, w2):
        return cutlass_fused_moe(x, ids, w, w1, w2, torch.float32, [])[0]

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    got = compiled(args["input"], args["token_selected_experts"], args["token_final_scales"],
                   args["fc1_expert_weights"], args["fc2_expert_weights"])
    assert rel_error(got, eager) < 1e-6


def test_torch_compile_fullgraph_trtllm_bf16_moe():
    args = _bf16_args(seed=4)
    eager = trtllm_bf16_moe(**args, routing_method_type=RoutingMethodType.Renormalize)

    def fn(logits, x, w1, w2):
        return trtllm_bf16_moe(logits, None, x, w1, w2, E, K, None, None, I, 0, E,
                               routing_method_type=RoutingMethodType.Renormalize,
                               use_shuffled_weight=False, weight_layout=WeightLayout.MajorK)

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    got = compiled(args["routing_logits"], args["hidden_states"], args["gemm1_weights"],
                   args["gemm2_weights"])
    assert rel_error(got, eager) == 0
