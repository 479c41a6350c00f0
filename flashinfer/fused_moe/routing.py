"""MoE routing (upstream ``flashinfer.tllm_enums`` enums and ``fused_topk_deepseek``).

The routing methods, by ``RoutingMethodType`` value (upstream numbering, which must match
TensorRT-LLM's ``runner.h``). ``l`` are the router logits ``[T, E]``, ``b`` the optional routing
bias ``[E]``, ``k`` is ``top_k``, ``r`` the ``routed_scaling_factor`` (``None`` means 1.0):

===  ==================  ===========================================================================
 0   Default             ``p = softmax(l + b)``; top-k of ``p``; weights ``p[ids] * r``
 1   Renormalize         top-k of ``l + b``; weights ``softmax(l[ids] + b[ids]) * r``
 2   DeepSeekV3          ``s = sigmoid(l)``; select on ``s + b``: each of ``n_group`` groups scores
                         the sum of its two best experts, the ``topk_group`` best groups stay, top-k
                         inside them; weights ``s[ids] / sum(s[ids]) * r`` (un-biased ``s``)
 3   Llama4              top-1 of ``l + b`` (``top_k`` must be 1); weight ``sigmoid(l[id] + b[id]) * r``
 4   RenormalizeNaive    ``p = softmax(l + b)``; top-k; weights ``p[ids] / sum(p[ids]) * r`` (Qwen3)
 5   TopK                top-k of ``l + b``; uniform weights ``r / k`` (upstream's reference)
 6   SigmoidRenorm       ``s = sigmoid(l + b)``; top-k; weights ``s[ids] / sum(s[ids]) * r``
 7   MiniMax2            ``s = sigmoid(l)``; top-k of ``s + b``; weights ``s[ids] / (sum + 1e-20) * r``
 8   Sigmoid             ``s = sigmoid(l + b)``; top-k; weights ``s[ids] * r``
 9   TopKSigmoid         top-k of ``l + b``; weights ``sigmoid(l[ids] + b[ids]) * r``
10   Unspecified         rejected
===  ==================  ===========================================================================

``norm_topk_prob=False`` (the trtllm MoE entry points) drops the renormalisation: method 4 then
routes as 0 and method 6 as 8.

Tie-breaking (ours, deterministic on every backend): among equal selection scores the lowest
expert index wins, and among equal group scores the lowest group index. Ids are listed by
decreasing selection score (lowest index first among ties).

Canonical kernel signature (op ``"moe_routing"``; every backend registers exactly this)::

    kernel(logits, bias, method, top_k, n_group, topk_group, scale, weights_out, ids_out) -> None

``logits [T, E]`` float32/bfloat16/float16, any strides; ``bias`` None or ``[E]`` float;
``method`` an int from the table (never 4/6 with renormalisation dropped: mapped first);
``n_group``/``topk_group`` ints (1/1 unless DeepSeekV3); ``scale`` a float; ``weights_out
[T, top_k]`` float32 and ``ids_out [T, top_k]`` int32, contiguous, fully written.

Dispatch Problem: dtype ``logits``; shape facts ``num_tokens`` (bucketed to a power of two),
``num_experts``, ``top_k``; features ``bias``, ``grouped_topk`` (DeepSeekV3 with ``n_group > 1``).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Optional

import torch

from .. import dispatch
from ..api_logging import flashinfer_api
from ..custom_op import custom_op
from ..dispatch import Problem

__all__ = ["RoutingMethodType", "ActivationType", "RoutingInputMode", "WeightLayout",
           "Fp8QuantizationType", "is_gated_activation", "fused_topk_deepseek", "route"]


class RoutingMethodType(IntEnum):
    Default = 0
    Renormalize = 1
    DeepSeekV3 = 2
    Llama4 = 3
    RenormalizeNaive = 4
    TopK = 5
    SigmoidRenorm = 6
    MiniMax2 = 7
    Sigmoid = 8
    TopKSigmoid = 9
    Unspecified = 10


class RoutingInputMode(IntEnum):
    FromLogits = 0
    PackedPrecomputed = 1
    UnpackedPrecomputed = 2


class ActivationType(IntEnum):
    Gelu = 0
    Relu = 1
    Silu = 2
    Swiglu = 3
    Geglu = 4
    SwigluBias = 5
    Relu2 = 6
    SwigluStep = 7
    GegluTanh = 8
    Identity = 9
    Situ = 10
    InvalidType = 11


class WeightLayout(IntEnum):
    MajorK = 0
    MajorMn = 1
    BlockMajorK = 2


class Fp8QuantizationType(IntEnum):
    NoneFp8 = 0
    DeepSeekFp8 = 1
    MxFp8 = 2
    PerTensorFp8 = 3
    PerChannelFp8 = 4


_GATED = (ActivationType.Swiglu, ActivationType.Geglu, ActivationType.SwigluBias,
          ActivationType.SwigluStep, ActivationType.GegluTanh, ActivationType.Situ)


def is_gated_activation(activation_type) -> bool:
    """True for the gated activations (they read both halves of the gemm1 output)."""
    try:
        return ActivationType(int(activation_type)) in _GATED
    except ValueError:
        raise ValueError(f"activation_type={activation_type!r} is not an ActivationType value "
                         f"(0..{len(ActivationType) - 1})") from None


_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_SIGMOID_BIAS = (RoutingMethodType.DeepSeekV3, RoutingMethodType.MiniMax2)


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def check_routing(logits, bias, method, top_k: int, n_group, topk_group
                  ) -> tuple[RoutingMethodType, int, int]:
    """Validate a routing request; returns (method, n_group, topk_group) with defaults filled."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"routing_logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"routing_logits must be 2-D [num_tokens, num_experts], got shape "
                         f"{tuple(logits.shape)}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise ValueError(f"routing_logits has unsupported dtype {logits.dtype}; allowed: "
                         "float32, bfloat16, float16")
    num_experts = logits.shape[1]
    try:
        method = RoutingMethodType(int(method))
    except (TypeError, ValueError):
        raise ValueError(f"routing_method_type={method!r} is not a RoutingMethodType value "
                         "(0..9)") from None
    if method == RoutingMethodType.Unspecified:
        raise ValueError("routing_method_type=Unspecified (10) names no routing; choose 0..9")
    _int("top_k", top_k, 1)
    if top_k > num_experts:
        raise ValueError(f"top_k={top_k} exceeds num_experts={num_experts}")
    if method == RoutingMethodType.Llama4 and top_k != 1:
        raise ValueError(f"top_k must be 1 for Llama4 routing (top-1 sigmoid), got {top_k}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"routing_bias must be a torch.Tensor or None, got "
                            f"{type(bias).__name__}")
        if bias.dim() != 1 or bias.shape[0] != num_experts:
            raise ValueError(f"routing_bias must have shape ({num_experts},), got "
                             f"{tuple(bias.shape)}")
        if not bias.is_floating_point():
            raise ValueError(f"routing_bias must be a float tensor, got dtype {bias.dtype}")
        if bias.device != logits.device:
            raise ValueError(f"routing_bias is on {bias.device} but routing_logits is on "
                             f"{logits.device}")
    if method != RoutingMethodType.DeepSeekV3:
        return method, 1, 1
    if bias is None:
        raise ValueError("routing_bias is required for DeepSeekV3 routing (the score correction "
                         "bias [num_experts]), got None")
    n_group = _int("n_group", n_group, 1)
    topk_group = _int("topk_group", topk_group, 1)
    if num_experts % n_group:
        raise ValueError(f"num_experts={num_experts} must be a multiple of n_group={n_group}")
    if topk_group > n_group:
        raise ValueError(f"topk_group={topk_group} exceeds n_group={n_group}")
    if topk_group * (num_experts // n_group) < top_k:
        raise ValueError(f"top_k={top_k} exceeds the experts left in topk_group={topk_group} "
                         f"groups of {num_experts // n_group}")
    return method, n_group, topk_group


def _scale(routed_scaling_factor) -> float:
    if routed_scaling_factor is None:
        return 1.0
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor,
                                                                 (int, float)):
        raise ValueError(f"routed_scaling_factor must be a float or None, got "
                         f"{routed_scaling_factor!r}")
    return float(routed_scaling_factor)


def _no_output(*args, **kwargs) -> None:
    return None


@custom_op("moe_routing", mutates_args=("weights_out", "ids_out"), fake=_no_output)
def _routing_op(weights_out: torch.Tensor, ids_out: torch.Tensor, logits: torch.Tensor,
                bias: Optional[torch.Tensor], method: int, top_k: int, n_group: int,
                topk_group: int, scale: float, backend: str) -> None:
    features = []
    if bias is not None:
        features.append("bias")
    if n_group > 1:
        features.append("grouped_topk")
    problem = Problem.make("moe_routing", logits.device, dtypes={"logits": logits.dtype},
                           shape={"num_tokens": dispatch.length_bucket(logits.shape[0]),
                                  "num_experts": logits.shape[1], "top_k": top_k},
                           features=features)
    dispatch.decide(problem, backend).kernel(logits, bias, method, top_k, n_group, topk_group,
                                             scale, weights_out, ids_out)


def route(logits: torch.Tensor, bias: Optional[torch.Tensor], method, top_k: int,
          n_group=None, topk_group=None, routed_scaling_factor=None, norm_topk_prob: bool = True,
          backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Route ``logits [T, E]``: returns ``(weights [T, top_k] float32, ids [T, top_k] int32)``
    by the method table of this module. Shared by the fused MoE entry points."""
    method, n_group, topk_group = check_routing(logits, bias, method, top_k, n_group, topk_group)
    if not norm_topk_prob:
        method = {RoutingMethodType.RenormalizeNaive: RoutingMethodType.Default,
                  RoutingMethodType.SigmoidRenorm: RoutingMethodType.Sigmoid}.get(method, method)
    weights = torch.empty((logits.shape[0], top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((logits.shape[0], top_k), dtype=torch.int32, device=logits.device)
    if logits.shape[0]:
        _routing_op(weights, ids, logits, bias, int(method), top_k, n_group, topk_group,
                    _scale(routed_scaling_factor), backend)
    return weights, ids


def record_replay(routing_replay_out: Optional[torch.Tensor], ids: torch.Tensor) -> None:
    """Write the chosen expert ids into ``routing_replay_out`` (int16 ``[>= T, top_k]``)."""
    if routing_replay_out is None:
        return
    t = routing_replay_out
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int16 or t.dim() != 2:
        raise ValueError("routing_replay_out must be an int16 tensor [>= num_tokens, top_k], got "
                         f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if t.shape[0] < ids.shape[0] or t.shape[1] != ids.shape[1]:
        raise ValueError(f"routing_replay_out must have shape [>= {ids.shape[0]}, {ids.shape[1]}]"
                         f", got {tuple(t.shape)}")
    t[: ids.shape[0]].copy_(ids)


@flashinfer_api
def fused_topk_deepseek(scores: torch.Tensor, bias: torch.Tensor, n_group: int, topk_group: int,
                        topk: int, routed_scaling_factor: float, topk_values: torch.Tensor,
                        topk_indices: torch.Tensor, launch_with_pdl: bool = True,
                        routing_replay_out: Optional[torch.Tensor] = None, *,
                        backend: str = "default") -> None:
    """DeepSeek-V3 routing (method 2 of the module table), written in place; returns None.

    ``scores [T, E]`` router logits (float32/bfloat16/float16), ``bias [E]``; ``topk_values
    [T, topk]`` (dtype of ``scores``) receives the weights, ``topk_indices [T, topk]`` int32 the
    expert ids; ``routing_replay_out`` optional int16 ``[>= T, topk]`` gets the ids too.
    Upstream's kernel limits are kept: ``n_group <= 32``, ``topk <= 8``, and ``E / n_group <= 32``
    with ``(E / n_group) * topk_group <= 128`` when ``n_group > 1``, ``E <= 384`` otherwise.
    ``backend``: ``"default"`` means ``"auto"``; ours (``"torch"``, ``"reference"``) are accepted;
    upstream's ``"cake"`` has no counterpart (ValueError). ``launch_with_pdl`` is ignored.
    """
    if backend == "cake":
        raise ValueError("backend='cake' (upstream's SM 10.x CuTe kernel) has no counterpart "
                         "here; use 'default', 'torch' or 'reference'")
    backend = "auto" if backend == "default" else backend
    method, n_group, topk_group = check_routing(scores, bias, RoutingMethodType.DeepSeekV3, topk,
                                                n_group, topk_group)
    num_experts = scores.shape[1]
    if n_group > 32 or topk > 8:
        raise ValueError(f"fused_topk_deepseek needs n_group <= 32 and topk <= 8, got "
                         f"n_group={n_group}, topk={topk}")
    group = num_experts // n_group
    if n_group > 1 and (group > 32 or group * topk_group > 128):
        raise ValueError(f"with n_group > 1 fused_topk_deepseek needs num_experts / n_group <= 32"
                         f" and (num_experts / n_group) * topk_group <= 128, got {group} and "
                         f"{group * topk_group}")
    if n_group == 1 and num_experts > 384:
        raise ValueError(f"with n_group == 1 fused_topk_deepseek needs num_experts <= 384, got "
                         f"{num_experts}")
    shape = (scores.shape[0], topk)
    for name, t, dtype in (("topk_values", topk_values, scores.dtype),
                           ("topk_indices", topk_indices, torch.int32)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != scores.device:
            raise ValueError(f"{name} must be a {dtype} tensor of shape {shape} on "
                             f"{scores.device}, got {t.dtype} {tuple(t.shape)} on {t.device}")
    weights, ids = route(scores, bias, method, topk, n_group, topk_group,
                         _scale(routed_scaling_factor), backend=backend)
    topk_values.copy_(weights)
    topk_indices.copy_(ids)
    record_replay(routing_replay_out, ids)
