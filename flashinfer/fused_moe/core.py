"""Fused MoE entry points (upstream ``flashinfer.fused_moe``): ``cutlass_fused_moe`` (routing
given) and the trtllm-gen style ``trtllm_bf16_moe``, ``trtllm_fp8_per_tensor_scale_moe``,
``trtllm_fp8_block_scale_moe``, ``trtllm_fp4_block_scale_moe`` (routing from logits, by
``routing_method_type``; see :mod:`flashinfer.fused_moe.routing`).

Names, argument order, defaults and return conventions are upstream's (api-spec.md §5):
``cutlass_fused_moe`` returns ``[output]`` (a list), the trtllm fp8/bf16 functions return the
bare ``[T, hidden]`` tensor (``do_finalize=True``), ``trtllm_fp4_block_scale_moe`` would return
``[output]``. ``output=`` is written in place (and returned the same way).

The experts (every API): ``gemm1_weights [E_local, 2I, H]``, ``gemm2_weights [E_local, H, I]``
(row-major "MajorK", unshuffled), ``h = x @ gemm1[e].T``; the first half ``h[:, :I]`` is the
linear ("up", w3) branch and the second half ``h[:, I:]`` the gate (w1) branch, as TensorRT-LLM
orders them; ``y = act(gate) * up @ gemm2[e].T`` with act SiLU (``Swiglu``), erf GELU (``Geglu``)
or tanh GELU (``GegluTanh``); ``out[t] = sum_j weight[t, j] * y_{ids[t, j]}[t]`` (Llama-4's
``use_routing_scales_on_input`` scales the input instead). Global expert ids outside the local
range ``[local_expert_offset, local_expert_offset + E_local)`` contribute nothing (other ranks'
experts by design; ids that no rank owns are errors, see ``cutlass_fused_moe``).

Not served (ValueError naming the argument): shuffled / block-major weight layouts (upstream
prepares them for its trtllm-gen kernels: pass ``use_shuffled_weight=False``, ``weight_layout=
WeightLayout.MajorK``), ``do_finalize=False``, biases and SwiGLU alpha/beta/limit, fused shared
experts, MxFp8, W4 / FP4 / packed weights, all-to-all. FP4 needs SM 10.x+ hardware and
TensorRT-LLM's kernels; no backend here serves it (``BackendUnavailableError``, a ValueError).

Canonical kernel signature (op ``"fused_moe"``; every backend registers exactly this)::

    kernel(x, x_scale, w1, w1_scale, w2, w2_scale, ids, weights, spec, out) -> None

``x [T, H]`` float32/float16/bfloat16 or float8_e4m3fn; ``x_scale`` None or float32
``[T, ceil(H/128)]`` (fp8 1x128 activation blocks, any strides); ``w1 [E, 2I, H]``, ``w2
[E, H, I]`` in x's dtype or float8_e4m3fn; ``w1_scale``/``w2_scale`` None, or for
``spec.quant == "fp8_block_scale"`` float32 ``[E, ceil(2I/128), ceil(H/128)]`` /
``[E, ceil(H/128), ceil(I/128)]``, for ``"fp8_per_tensor"`` float32 ``[E, 2]`` (up, gate
dequantisation of gemm1's output) / ``[E]`` (gemm2's); ``ids [T, k]`` int32 global expert ids,
``weights [T, k]`` float32; ``spec`` an :class:`ExpertSpec`; ``out [T, H]`` contiguous
bfloat16/float16/float32, fully written. A pair whose id is not a local expert (``[spec.
expert_offset, spec.expert_offset + E)``) contributes nothing. With ``spec.ids_fault`` set, an id
outside ``[0, spec.num_experts_total)`` is also reported under that fault into the device's
error record (:mod:`flashinfer.index_checks`; Triton in-kernel, torch and the reference with
device ops, never a host sync for it); the caller has checked host arrays already.

Dispatch Problem: dtypes ``hidden``, ``weight``, ``out``; shape facts ``num_tokens`` (bucketed),
``hidden_size``, ``intermediate_size``, ``num_experts`` (local), ``top_k``; features
``fp8_block_scale``, ``fp8_per_tensor``, ``geglu``, ``scales_on_input``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from .. import dispatch, index_checks
from ..backend_names import family_spelling
from ..api_logging import flashinfer_api
from ..custom_op import custom_op
from ..dispatch import BackendUnavailableError, Problem
from ..index_checks import Fault
from .checks import EXPERT_IDS, expert_ids_check, raise_expert_ids
from .checks import (activation as _activation, hidden as _hidden, layout as _layout,
                     local as _local, names as _names, output as _output,
                     routing_logits as _routing_logits, tensor as _tensor,
                     unsupported as _unsupported, weights as _weights)
from .routing import ActivationType, Fp8QuantizationType, WeightLayout, record_replay, route

__all__ = ["ExpertSpec", "cutlass_fused_moe", "trtllm_bf16_moe", "trtllm_fp8_per_tensor_scale_moe",
           "trtllm_fp8_block_scale_moe", "trtllm_fp4_block_scale_moe"]

_E4M3 = torch.float8_e4m3fn
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class ExpertSpec:
    """What the experts compute beyond the GEMMs (see the module docstring)."""

    quant: str            # "none" | "fp8_block_scale" | "fp8_per_tensor"
    activation: int       # ActivationType: Swiglu, Geglu or GegluTanh
    expert_offset: int    # global id of local expert 0
    scales_on_input: bool  # routing weights scale the input (Llama-4), not the output
    num_experts_total: int = 0  # global expert count (every rank's experts): ids in [0, it)
    #: the fault a kernel reports an id outside [0, num_experts_total) under (the caller's names,
    #: fused_moe.checks.EXPERT_IDS); None: the ids come from our routing and are trusted
    ids_fault: Optional[Fault] = None


# --------------------------------------------------------------------------------------------
# custom op (dispatch + kernel call)


def _no_output(*args, **kwargs) -> None:
    return None


@custom_op("fused_moe", mutates_args=("out",), fake=_no_output)
def _experts_op(out: torch.Tensor, x: torch.Tensor, x_scale: Optional[torch.Tensor],
                w1: torch.Tensor, w1_scale: Optional[torch.Tensor], w2: torch.Tensor,
                w2_scale: Optional[torch.Tensor], ids: torch.Tensor, weights: torch.Tensor,
                quant: str, activation: int, expert_offset: int, scales_on_input: bool,
                num_experts_total: int, check_ids: bool, backend: str) -> None:
    features = [] if quant == "none" else [quant]
    if activation != ActivationType.Swiglu:
        features.append("geglu")
    if scales_on_input:
        features.append("scales_on_input")
    problem = Problem.make("fused_moe", x.device,
                           dtypes={"hidden": x.dtype, "weight": w1.dtype, "out": out.dtype},
                           shape={"num_tokens": dispatch.length_bucket(x.shape[0]),
                                  "hidden_size": x.shape[1], "intermediate_size": w2.shape[2],
                                  "num_experts": w1.shape[0], "top_k": ids.shape[1]},
                           features=features)
    if check_ids and index_checks.host_check_wanted(ids.device):
        raise_expert_ids(ids, num_experts_total)
    spec = ExpertSpec(quant, activation, expert_offset, scales_on_input, num_experts_total,
                      EXPERT_IDS if check_ids else None)
    dispatch.decide(problem, backend).kernel(x, x_scale, w1, w1_scale, w2, w2_scale, ids,
                                             weights, spec, out)


def _run(out, x, x_scale, w1, w1_scale, w2, w2_scale, ids, weights, quant, activation,
         expert_offset, scales_on_input, backend, *, num_experts_total: int,
         check_ids: bool = False) -> torch.Tensor:
    """``check_ids``: ``ids`` are the caller's (``cutlass_fused_moe``), checked against
    ``[0, num_experts_total)``; else they come from our routing (always in range)."""
    if out.numel():
        _experts_op(out, x, x_scale, w1, w1_scale, w2, w2_scale, ids, weights, quant, activation,
                    expert_offset, scales_on_input, num_experts_total, check_ids, backend)
    elif check_ids and ids.numel() and not torch.compiler.is_compiling():
        # no kernel runs (hidden size 0): the ids are still checked
        if index_checks.host_check_wanted(ids.device):
            raise_expert_ids(ids, num_experts_total)
        else:
            index_checks.report_device(expert_ids_check(ids, num_experts_total))
    return out


# --------------------------------------------------------------------------------------------
# public API


@flashinfer_api
def cutlass_fused_moe(input: torch.Tensor, token_selected_experts: torch.Tensor,
                      token_final_scales: torch.Tensor, fc1_expert_weights: torch.Tensor,
                      fc2_expert_weights: torch.Tensor, output_dtype: torch.dtype,
                      quant_scales: List[torch.Tensor],
                      fc1_expert_biases: Optional[torch.Tensor] = None,
                      fc2_expert_biases: Optional[torch.Tensor] = None,
                      input_sf: Optional[torch.Tensor] = None,
                      swiglu_alpha: Optional[torch.Tensor] = None,
                      swiglu_beta: Optional[torch.Tensor] = None,
                      swiglu_limit: Optional[torch.Tensor] = None, tp_size: int = 1,
                      tp_rank: int = 0, ep_size: int = 1, ep_rank: int = 0,
                      cluster_size: int = 1, cluster_rank: int = 0,
                      output: Optional[torch.Tensor] = None, enable_alltoall: bool = False,
                      use_deepseek_fp8_block_scale: bool = False,
                      use_w4_group_scaling: bool = False, use_mxfp8_act_scaling: bool = False,
                      min_latency_mode: bool = False, use_packed_weights: bool = False,
                      use_wfp4afp8_humming: bool = False, tune_max_num_tokens: int = 8192,
                      enable_pdl: Optional[bool] = None,
                      activation_type: ActivationType = ActivationType.Swiglu,
                      swizzled_input_sf: bool = True, use_fused_finalize: bool = True,
                      profile_ids: Optional[List[int]] = None,
                      workspace_buffer: Optional[torch.Tensor] = None, *,
                      clamped_relu2_limit: Optional[torch.Tensor] = None,
                      situ_beta: Optional[torch.Tensor] = None,
                      situ_linear_beta: Optional[torch.Tensor] = None,
                      backend: str = "auto") -> List[torch.Tensor]:
    """MoE with precomputed routing; returns ``[output]`` (upstream's list convention).

    ``input [T, H]``; ``token_selected_experts [T, k]`` int32 global ids; ``token_final_scales
    [T, k]`` float32; ``fc1_expert_weights [E_local, 2I, H]``, ``fc2_expert_weights
    [E_local, H, I]``; ``output_dtype`` bf16/fp16/fp32. Local experts are ``[ep_rank * E_local,
    (ep_rank + 1) * E_local)``; tensor parallelism only shards the weights (the result is this
    rank's partial sum, as upstream).

    Expert ids: an id owned by another expert-parallel rank (in ``[0, E_local * ep_size)`` but
    outside this rank's range) is skipped by design, its pair contributes nothing (the other
    rank adds it). An id outside ``[0, E_local * ep_size)`` is an error (the contract of
    :mod:`flashinfer.index_checks`): CPU tensors (and GPU tensors with
    ``FLASHINFER_CHECK_INDICES=1``) raise ``ValueError`` naming ``token_selected_experts[t, j]``,
    its value and the allowed range before anything runs; on a GPU the ids are not read back:
    each backend's kernel skips the bad pair (it contributes nothing, like another rank's) and
    records the first one, raised by ``flashinfer.check_errors()`` (the device record numbers
    the entry flat, ``t * top_k + j``). A token whose every pair is skipped gets a zero row.
    Routing weights are data, not checked: a non-finite ``token_final_scales[t, j]`` of a local
    pair makes row ``t`` non-finite, no other row.

    Quantisation:

    * none: input and weights float32/float16/bfloat16 of one dtype, ``quant_scales`` empty/None;
    * ``use_deepseek_fp8_block_scale=True``: bf16/fp16 input, float8_e4m3fn weights,
      ``quant_scales = [fc1 scales [E, 2I/128, H/128], fc2 scales [E, H/128, I/128]]`` float32
      (128x128 blocks). The Triton kernel (``auto`` from SM 8.9) runs W8A8 as upstream does: the
      input and the intermediate are quantised to fp8 per token and 128-wide group on the fly;
      ``backend="torch"`` and the reference keep them in bf16 (a few percent closer to exact);
    * fp8 per tensor (float8_e4m3fn input and weights): ``quant_scales = [fc1 dequant [E],
      fc2 activation quant (one element), fc2 dequant [E], fc1 input dequant (one element, folded
      into fc1 dequant by the caller, unused)]``; the intermediate is not rounded to fp8 here.

    ``backend``: ``"auto"`` (ours), ``"torch"``, ``"reference"``; upstream's ``"cutlass"`` means
    ``"auto"`` (no CUTLASS MoE kernel here), ``"cake"`` has no counterpart (ValueError).
    ``tune_max_num_tokens``, ``enable_pdl``, ``profile_ids``, ``workspace_buffer``,
    ``swizzled_input_sf`` and ``use_fused_finalize`` are accepted and ignored (results here are
    deterministic either way).
    """
    backend = family_spelling("moe", backend)
    _unsupported(fc1_expert_biases=fc1_expert_biases, fc2_expert_biases=fc2_expert_biases,
                 input_sf=input_sf, swiglu_alpha=swiglu_alpha, swiglu_beta=swiglu_beta,
                 swiglu_limit=swiglu_limit, enable_alltoall=enable_alltoall,
                 use_w4_group_scaling=use_w4_group_scaling,
                 use_mxfp8_act_scaling=use_mxfp8_act_scaling, min_latency_mode=min_latency_mode,
                 use_packed_weights=use_packed_weights, use_wfp4afp8_humming=use_wfp4afp8_humming,
                 clamped_relu2_limit=clamped_relu2_limit, situ_beta=situ_beta,
                 situ_linear_beta=situ_linear_beta)
    for name, size, rank in (("tp", tp_size, tp_rank), ("ep", ep_size, ep_rank),
                             ("cluster", cluster_size, cluster_rank)):
        if not (isinstance(size, int) and isinstance(rank, int) and 0 <= rank < size):
            raise ValueError(f"{name}_rank={rank!r} must be in [0, {name}_size={size!r})")
    activation = _activation(activation_type)
    tokens, _ = _hidden("input", input, _FLOATS + (_E4M3,))
    scales = list(quant_scales or [])
    names = ("fc1_expert_weights", "fc2_expert_weights")
    if use_deepseek_fp8_block_scale:
        if input.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"input must be bfloat16 or float16 with "
                             f"use_deepseek_fp8_block_scale=True, got {input.dtype}")
        quant, (num, inter) = "fp8_block_scale", _weights(input, fc1_expert_weights,
                                                          fc2_expert_weights, (_E4M3,), names)
        if len(scales) != 2:
            raise ValueError(f"quant_scales must be [fc1 block scales, fc2 block scales] with "
                             f"use_deepseek_fp8_block_scale=True, got {len(scales)} tensors")
        hid = input.shape[1]
        w1_scale = _tensor("quant_scales[0]", scales[0], (num, -(-2 * inter // 128),
                           -(-hid // 128)), (torch.float32,), input.device)
        w2_scale = _tensor("quant_scales[1]", scales[1], (num, -(-hid // 128),
                           -(-inter // 128)), (torch.float32,), input.device)
    elif input.dtype == _E4M3:
        quant, (num, inter) = "fp8_per_tensor", _weights(input, fc1_expert_weights,
                                                         fc2_expert_weights, (_E4M3,), names)
        if len(scales) != 4:
            raise ValueError("quant_scales must be [fc1 dequant [E], fc2 act quant, fc2 dequant "
                             f"[E], fc1 input dequant] for fp8 input, got {len(scales)} tensors")
        fc1 = _tensor("quant_scales[0]", scales[0], (num,), (torch.float32,), input.device)
        act = scales[1]
        if not isinstance(act, torch.Tensor) or act.numel() != 1 or act.dtype != torch.float32:
            raise ValueError("quant_scales[1] (fc2 activation quant scale) must be a float32 "
                             "tensor with one element")
        fc2 = _tensor("quant_scales[2]", scales[2], (num,), (torch.float32,), input.device)
        w1_scale = torch.stack([fc1, fc1], dim=1).float()
        w2_scale = fc2 * act.to(fc2.device).reshape(())
    else:
        quant, (num, inter) = "none", _weights(input, fc1_expert_weights, fc2_expert_weights,
                                               (input.dtype,), names)
        if scales:
            raise ValueError(f"quant_scales must be empty for unquantised {input.dtype} experts, "
                             f"got {len(scales)} tensors")
        w1_scale = w2_scale = None
    if not isinstance(token_selected_experts, torch.Tensor) or token_selected_experts.dim() != 2:
        raise ValueError("token_selected_experts must be a 2-D int32 tensor [num_tokens, top_k]")
    top_k = token_selected_experts.shape[1]
    _tensor("token_selected_experts", token_selected_experts, (tokens, top_k), (torch.int32,),
            input.device)
    _tensor("token_final_scales", token_final_scales, (tokens, top_k), (torch.float32,),
            input.device)
    if output_dtype not in _FLOATS:
        raise ValueError(f"output_dtype={output_dtype} is not supported; allowed: "
                         f"{_names(_FLOATS)}")
    out = _output(output, (tokens, input.shape[1]), output_dtype, input.device)
    _run(out, input, None, fc1_expert_weights, w1_scale, fc2_expert_weights, w2_scale,
         token_selected_experts, token_final_scales, quant, activation, ep_rank * num, False,
         backend, num_experts_total=num * ep_size, check_ids=True)
    return [out]


def _trtllm_common(routing_logits, routing_bias, hidden_states, gemm1_weights, num_experts,
                   top_k, n_group, topk_group, intermediate_size, local_expert_offset,
                   local_num_experts, routed_scaling_factor, routing_method_type, do_finalize,
                   activation_type, norm_topk_prob, routing_replay_out, backend, **unsupported):
    """Shared checks and the routing of the trtllm entry points; returns (activation, weights,
    ids)."""
    _unsupported(**unsupported)
    if not do_finalize:
        raise ValueError("do_finalize=False (unreduced expert outputs) is not supported; "
                         "pass do_finalize=True")
    activation = _activation(activation_type)
    _routing_logits(routing_logits, hidden_states, num_experts)
    _local(num_experts, local_expert_offset, local_num_experts, gemm1_weights.shape[0])
    if gemm1_weights.shape[1] != 2 * intermediate_size:
        raise ValueError(f"intermediate_size={intermediate_size} does not match gemm1_weights "
                         f"{tuple(gemm1_weights.shape)} (2 * intermediate_size rows)")
    weights, ids = route(routing_logits, routing_bias, routing_method_type, top_k, n_group,
                         topk_group, routed_scaling_factor, norm_topk_prob, backend)
    record_replay(routing_replay_out, ids)
    return activation, weights, ids


@flashinfer_api
def trtllm_bf16_moe(routing_logits: torch.Tensor, routing_bias: Optional[torch.Tensor],
                    hidden_states: torch.Tensor, gemm1_weights: torch.Tensor,
                    gemm2_weights: torch.Tensor, num_experts: int, top_k: int,
                    n_group: Optional[int], topk_group: Optional[int], intermediate_size: int,
                    local_expert_offset: int, local_num_experts: int,
                    routed_scaling_factor: Optional[float] = None, routing_method_type: int = 0,
                    use_shuffled_weight: bool = True,
                    weight_layout: int = WeightLayout.BlockMajorK, do_finalize: bool = True,
                    enable_pdl: bool = True, tune_max_num_tokens: int = 8192,
                    activation_type: int = ActivationType.Swiglu.value,
                    norm_topk_prob: bool = True,
                    routing_replay_out: Optional[torch.Tensor] = None,
                    gemm1_alpha: Optional[torch.Tensor] = None,
                    gemm1_beta: Optional[torch.Tensor] = None,
                    gemm1_clamp_limit: Optional[torch.Tensor] = None,
                    output: Optional[torch.Tensor] = None, *,
                    backend: str = "auto") -> torch.Tensor:
    """bf16 MoE routed from ``routing_logits [T, num_experts]``; returns ``output [T, H]`` bf16.

    ``hidden_states [T, H]``, ``gemm1_weights [E_local, 2I, H]``, ``gemm2_weights [E_local, H,
    I]`` bf16. Upstream's defaults (``use_shuffled_weight=True``, ``BlockMajorK``) describe
    weights prepared for its trtllm-gen kernels and are rejected: pass ``use_shuffled_weight=
    False, weight_layout=WeightLayout.MajorK``. ``enable_pdl``/``tune_max_num_tokens`` ignored.
    """
    backend = family_spelling("moe", backend)
    _hidden("hidden_states", hidden_states, (torch.bfloat16,))
    _layout(use_shuffled_weight, weight_layout)
    num, _ = _weights(hidden_states, gemm1_weights, gemm2_weights, (torch.bfloat16,))
    activation, weights, ids = _trtllm_common(
        routing_logits, routing_bias, hidden_states, gemm1_weights, num_experts, top_k, n_group,
        topk_group, intermediate_size, local_expert_offset, local_num_experts,
        routed_scaling_factor, routing_method_type, do_finalize, activation_type, norm_topk_prob,
        routing_replay_out, backend, gemm1_alpha=gemm1_alpha, gemm1_beta=gemm1_beta,
        gemm1_clamp_limit=gemm1_clamp_limit)
    out = _output(output, tuple(hidden_states.shape), torch.bfloat16, hidden_states.device)
    return _run(out, hidden_states, None, gemm1_weights, None, gemm2_weights, None, ids, weights,
                "none", activation, local_expert_offset, False, backend,
                num_experts_total=num_experts)


@flashinfer_api
def trtllm_fp8_per_tensor_scale_moe(
        routing_logits: torch.Tensor, routing_bias: Optional[torch.Tensor],
        hidden_states: torch.Tensor, gemm1_weights: torch.Tensor,
        output1_scales_scalar: torch.Tensor, output1_scales_gate_scalar: torch.Tensor,
        gemm2_weights: torch.Tensor, output2_scales_scalar: torch.Tensor, num_experts: int,
        top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int,
        local_expert_offset: int, local_num_experts: int,
        routed_scaling_factor: Optional[float], use_routing_scales_on_input: bool,
        routing_method_type: int = 0, do_finalize: bool = True, enable_pdl: Optional[bool] = None,
        tune_max_num_tokens: int = 8192, activation_type: int = ActivationType.Swiglu.value,
        norm_topk_prob: bool = True, routing_replay_out: Optional[torch.Tensor] = None,
        output: Optional[torch.Tensor] = None,
        gemm1_clamp_limit: Optional[torch.Tensor] = None, *,
        backend: str = "auto") -> torch.Tensor:
    """fp8 (e4m3) MoE with per-expert scalar scales; returns ``output [T, H]`` bf16.

    ``hidden_states [T, H]``, ``gemm1_weights [E_local, 2I, H]``, ``gemm2_weights [E_local, H,
    I]`` float8_e4m3fn; float32 ``[E_local]`` scales: ``output1_scales_scalar`` multiplies the up
    half of gemm1's output, ``output1_scales_gate_scalar`` the gate half (the input's scale is
    folded into both), ``output2_scales_scalar`` gemm2's output. Upstream folds the fp8
    re-quantisation of the intermediate into these scales; it is not rounded to fp8 here.
    ``use_routing_scales_on_input=True`` (Llama-4) scales the input by the routing weight.
    """
    backend = family_spelling("moe", backend)
    _hidden("hidden_states", hidden_states, (_E4M3,))
    num, _ = _weights(hidden_states, gemm1_weights, gemm2_weights, (_E4M3,))
    dev = hidden_states.device
    up = _tensor("output1_scales_scalar", output1_scales_scalar, (num,), (torch.float32,), dev)
    gate = _tensor("output1_scales_gate_scalar", output1_scales_gate_scalar, (num,),
                   (torch.float32,), dev)
    s2 = _tensor("output2_scales_scalar", output2_scales_scalar, (num,), (torch.float32,), dev)
    activation, weights, ids = _trtllm_common(
        routing_logits, routing_bias, hidden_states, gemm1_weights, num_experts, top_k, n_group,
        topk_group, intermediate_size, local_expert_offset, local_num_experts,
        routed_scaling_factor, routing_method_type, do_finalize, activation_type, norm_topk_prob,
        routing_replay_out, backend, gemm1_clamp_limit=gemm1_clamp_limit)
    out = _output(output, tuple(hidden_states.shape), torch.bfloat16, dev)
    return _run(out, hidden_states, None, gemm1_weights, torch.stack([up, gate], dim=1),
                gemm2_weights, s2, ids, weights, "fp8_per_tensor", activation,
                local_expert_offset, bool(use_routing_scales_on_input), backend,
                num_experts_total=num_experts)


@flashinfer_api
def trtllm_fp8_block_scale_moe(
        routing_logits: torch.Tensor, routing_bias: Optional[torch.Tensor],
        hidden_states: torch.Tensor, hidden_states_scale: torch.Tensor,
        gemm1_weights: torch.Tensor, gemm1_weights_scale: torch.Tensor,
        gemm2_weights: torch.Tensor, gemm2_weights_scale: torch.Tensor, num_experts: int,
        top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int,
        local_expert_offset: int, local_num_experts: int,
        routed_scaling_factor: Optional[float], routing_method_type: int = 0,
        use_shuffled_weight: bool = False, weight_layout: int = 0, do_finalize: bool = True,
        enable_pdl: Optional[bool] = None, tune_max_num_tokens: int = 8192,
        fp8_quantization_type: Fp8QuantizationType = Fp8QuantizationType.DeepSeekFp8,
        num_fused_shared_experts: Optional[int] = None,
        activation_type: int = ActivationType.Swiglu.value, norm_topk_prob: bool = True,
        routing_replay_out: Optional[torch.Tensor] = None,
        gemm1_alpha: Optional[torch.Tensor] = None, gemm1_beta: Optional[torch.Tensor] = None,
        gemm1_clamp_limit: Optional[torch.Tensor] = None,
        output: Optional[torch.Tensor] = None, valid_hidden_size: Optional[int] = None,
        valid_intermediate_size: Optional[int] = None, *,
        gemm1_bias: Optional[torch.Tensor] = None, gemm2_bias: Optional[torch.Tensor] = None,
        backend: str = "auto") -> torch.Tensor:
    """DeepSeek fp8 block-scaled MoE; returns ``output [T, H]`` bf16.

    ``hidden_states [T, H]`` float8_e4m3fn with ``hidden_states_scale [ceil(H/128), T]`` float32
    (transposed, 1x128 blocks), or bf16/fp16 (the scale is then ignored); ``gemm1_weights
    [E_local, 2I, H]`` / ``gemm2_weights [E_local, H, I]`` float8_e4m3fn with 128x128 block
    scales ``gemm1_weights_scale [E_local, ceil(2I/128), ceil(H/128)]`` / ``gemm2_weights_scale
    [E_local, ceil(H/128), ceil(I/128)]`` float32. Only ``Fp8QuantizationType.DeepSeekFp8``.
    """
    backend = family_spelling("moe", backend)
    if int(fp8_quantization_type) != Fp8QuantizationType.DeepSeekFp8:
        raise ValueError(f"fp8_quantization_type={fp8_quantization_type!r} is not supported; "
                         "only Fp8QuantizationType.DeepSeekFp8 (128x128 blocks)")
    tokens, hid = _hidden("hidden_states", hidden_states, (_E4M3, torch.bfloat16, torch.float16))
    _layout(use_shuffled_weight, weight_layout)
    num, inter = _weights(hidden_states, gemm1_weights, gemm2_weights, (_E4M3,))
    dev = hidden_states.device
    x_scale = None
    if hidden_states.dtype == _E4M3:
        x_scale = _tensor("hidden_states_scale", hidden_states_scale, (-(-hid // 128), tokens),
                          (torch.float32,), dev).t()
    s1 = _tensor("gemm1_weights_scale", gemm1_weights_scale,
                 (num, -(-2 * inter // 128), -(-hid // 128)), (torch.float32,), dev)
    s2 = _tensor("gemm2_weights_scale", gemm2_weights_scale,
                 (num, -(-hid // 128), -(-inter // 128)), (torch.float32,), dev)
    activation, weights, ids = _trtllm_common(
        routing_logits, routing_bias, hidden_states, gemm1_weights, num_experts, top_k, n_group,
        topk_group, intermediate_size, local_expert_offset, local_num_experts,
        routed_scaling_factor, routing_method_type, do_finalize, activation_type, norm_topk_prob,
        routing_replay_out, backend, num_fused_shared_experts=num_fused_shared_experts or None,
        gemm1_alpha=gemm1_alpha, gemm1_beta=gemm1_beta, gemm1_clamp_limit=gemm1_clamp_limit,
        valid_hidden_size=valid_hidden_size, valid_intermediate_size=valid_intermediate_size,
        gemm1_bias=gemm1_bias, gemm2_bias=gemm2_bias)
    out = _output(output, (tokens, hid), torch.bfloat16, dev)
    return _run(out, hidden_states, x_scale, gemm1_weights, s1, gemm2_weights, s2, ids, weights,
                "fp8_block_scale", activation, local_expert_offset, False, backend,
                num_experts_total=num_experts)


@flashinfer_api
def trtllm_fp4_block_scale_moe(
        routing_logits: torch.Tensor, routing_bias: Optional[torch.Tensor],
        hidden_states: torch.Tensor, hidden_states_scale: Optional[torch.Tensor],
        gemm1_weights: torch.Tensor, gemm1_weights_scale: torch.Tensor,
        gemm1_bias: Optional[torch.Tensor], gemm1_alpha: Optional[torch.Tensor],
        gemm1_beta: Optional[torch.Tensor], gemm1_clamp_limit: Optional[torch.Tensor],
        gemm2_weights: torch.Tensor, gemm2_weights_scale: torch.Tensor,
        gemm2_bias: Optional[torch.Tensor], output1_scale_scalar: Optional[torch.Tensor],
        output1_scale_gate_scalar: Optional[torch.Tensor],
        output2_scale_scalar: Optional[torch.Tensor], num_experts: int, top_k: int,
        n_group: Optional[int], topk_group: Optional[int], intermediate_size: int,
        local_expert_offset: int, local_num_experts: int,
        routed_scaling_factor: Optional[float], routing_method_type: int = 0,
        do_finalize: bool = True, enable_pdl: Optional[bool] = None,
        activation_type: int = ActivationType.Swiglu.value,
        per_token_scale: Optional[torch.Tensor] = None, output: Optional[torch.Tensor] = None,
        tune_max_num_tokens: int = 8192, norm_topk_prob: bool = True,
        routing_replay_out: Optional[torch.Tensor] = None,
        num_fused_shared_experts: Optional[int] = None,
        valid_hidden_size: Optional[int] = None, valid_intermediate_size: Optional[int] = None,
        hidden_states_scale_layout=None, *, backend: str = "auto") -> List[torch.Tensor]:
    """NVFP4 / MXFP4 MoE (``gemm1_weights [E, 2I, H/2]`` uint8 packed e2m1). Declared for
    upstream compatibility only: FP4 needs SM 10.x+ hardware with TensorRT-LLM's trtllm-gen
    kernels and no backend of this library serves it, so every call raises
    :class:`~flashinfer.dispatch.BackendUnavailableError` (a ValueError) listing each backend's
    reasons. Upstream would return ``[output]``."""
    device = hidden_states.device if isinstance(hidden_states, torch.Tensor) else "cpu"
    weight = gemm1_weights.dtype if isinstance(gemm1_weights, torch.Tensor) else torch.uint8
    tokens = hidden_states.shape[0] if isinstance(hidden_states, torch.Tensor) else 1
    hidden = hidden_states.shape[-1] if isinstance(hidden_states, torch.Tensor) else 0
    problem = Problem.make("fused_moe", torch.device(device),
                           dtypes={"hidden": getattr(hidden_states, "dtype", torch.uint8),
                                   "weight": weight, "out": torch.bfloat16},
                           shape={"num_tokens": dispatch.length_bucket(tokens),
                                  "hidden_size": hidden, "intermediate_size": intermediate_size,
                                  "num_experts": local_num_experts, "top_k": top_k})
    raise BackendUnavailableError(
        problem, dispatch.evaluate_candidates(problem),
        "trtllm_fp4_block_scale_moe: FP4 (NVFP4 / MXFP4) MoE needs SM 10.x+ hardware with "
        "TensorRT-LLM's trtllm-gen kernels; no backend in this library serves it",
        remedy="use trtllm_fp8_block_scale_moe or trtllm_bf16_moe, or upstream FlashInfer on a "
               "Blackwell GPU")
