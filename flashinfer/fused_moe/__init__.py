"""Mixture of Experts (upstream module ``flashinfer.fused_moe``): routing methods and enums
(:mod:`.routing`) and the fused MoE entry points (:mod:`.core`)."""

from .core import (  # noqa: F401
    cutlass_fused_moe, trtllm_bf16_moe, trtllm_fp4_block_scale_moe,
    trtllm_fp8_block_scale_moe, trtllm_fp8_per_tensor_scale_moe,
)
from .routing import (  # noqa: F401
    ActivationType, Fp8QuantizationType, RoutingInputMode, RoutingMethodType, WeightLayout,
    fused_topk_deepseek, is_gated_activation,
)

__all__ = [
    "RoutingMethodType", "ActivationType", "RoutingInputMode", "WeightLayout",
    "Fp8QuantizationType", "is_gated_activation", "fused_topk_deepseek", "cutlass_fused_moe",
    "trtllm_bf16_moe", "trtllm_fp8_per_tensor_scale_moe", "trtllm_fp8_block_scale_moe",
    "trtllm_fp4_block_scale_moe",
]
