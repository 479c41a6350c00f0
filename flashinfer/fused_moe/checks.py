"""Argument checks of the fused MoE entry points (metadata only: they run on fake tensors too).
Every error names the argument, what was given and what is allowed.

The one index rule (the contract of :mod:`flashinfer.index_checks`): ``cutlass_fused_moe``'s
``token_selected_experts`` holds global expert ids in ``[0, E_local * ep_size)``
(:data:`EXPERT_IDS`). On the host (CPU tensors, or ``FLASHINFER_CHECK_INDICES=1``) a bad id
raises here (:func:`raise_expert_ids`); on a GPU every backend's kernel skips its (token, slot)
pair and reports it under :data:`EXPERT_IDS` (passed down in ``ExpertSpec.ids_fault``). The
trtllm entry points route internally, so their ids are always in range and are not checked.
"""

from __future__ import annotations

import torch

from ..index_checks import Check, fault
from .routing import ActivationType, WeightLayout

_ACTIVATIONS = (ActivationType.Swiglu, ActivationType.Geglu, ActivationType.GegluTanh)

_IDS_RULE = ("a global expert id in [0, {bound}) (fc1_expert_weights.shape[0] * ep_size)")
#: a bad entry of ``cutlass_fused_moe``'s ``token_selected_experts``; the device record numbers
#: entries flat, ``t * top_k + j`` for ``[t, j]``
EXPERT_IDS = fault("cutlass_fused_moe", "token_selected_experts",
                   _IDS_RULE + "; the entry is numbered flat, t * top_k + j for [t, j]")


def expert_ids_check(ids: torch.Tensor, num_experts_total: int, rule=EXPERT_IDS) -> Check:
    """The ids of ``ids [T, k]`` outside ``[0, num_experts_total)``, flat (device ops only)."""
    flat = ids.reshape(-1)
    return Check(rule, (flat < 0) | (flat >= num_experts_total), flat, num_experts_total)


def raise_expert_ids(ids: torch.Tensor, num_experts_total: int) -> None:
    """Host check of ``token_selected_experts [T, k]``: ``ValueError`` naming the first bad
    entry ``[t, j]``, its value and the allowed range (reads ``ids``: a sync on a GPU)."""
    bad = (ids < 0) | (ids >= num_experts_total)
    if ids.numel() == 0 or not bool(bad.any()):
        return
    t, j = (int(v) for v in bad.nonzero()[0])
    count = int(bad.sum())
    more = f" ({count} bad entries in all)" if count > 1 else ""
    raise ValueError(f"{EXPERT_IDS.function}: {EXPERT_IDS.argument}[{t}, {j}] = {int(ids[t, j])} "
                     f"is out of range; allowed: {_IDS_RULE.format(bound=num_experts_total)}"
                     f"{more}")



def names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def tensor(name: str, t, shape: tuple, dtypes, device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has unsupported dtype {t.dtype}; allowed: {names(dtypes)}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the hidden states are on {device}")
    return t


def hidden(name: str, x, dtypes) -> tuple[int, int]:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [num_tokens, hidden_size], got shape "
                         f"{tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} has unsupported dtype {x.dtype}; allowed: {names(dtypes)}")
    return tuple(x.shape)


def weights(x: torch.Tensor, w1, w2, dtypes,
            names=("gemm1_weights", "gemm2_weights")) -> tuple[int, int]:
    """Check ``w1 [E, 2I, H]``, ``w2 [E, H, I]``; returns (E, I)."""
    hidden = x.shape[1]
    for name, w in zip(names, (w1, w2)):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
        if w.dim() != 3:
            raise ValueError(f"{name} must be 3-D, got shape {tuple(w.shape)}")
    num, inter = w1.shape[0], w1.shape[1] // 2
    if w1.shape[1] % 2 or w1.shape[2] != hidden:
        raise ValueError(f"{names[0]} must be [num_experts, 2 * intermediate_size, hidden_size="
                         f"{hidden}] (gated), got {tuple(w1.shape)}")
    tensor(names[0], w1, w1.shape, dtypes, x.device)
    tensor(names[1], w2, (num, hidden, inter), dtypes, x.device)
    return num, inter


def activation(activation_type) -> int:
    try:
        act = ActivationType(int(activation_type))
    except (TypeError, ValueError):
        raise ValueError(f"activation_type={activation_type!r} is not an ActivationType "
                         "value") from None
    if act not in _ACTIVATIONS:
        raise ValueError(f"activation_type={act.name} is not served here; allowed: Swiglu (3), "
                         "Geglu (4), GegluTanh (8)")
    return int(act)


def unsupported(**flags) -> None:
    """Raise for the first argument that asks for something not served (truthy / not None)."""
    for name, value in flags.items():
        if value is not None and value is not False:
            raise ValueError(f"{name}={value!r} is not supported by this library's fused MoE "
                             "(see flashinfer.fused_moe.core)")


def layout(use_shuffled_weight, weight_layout) -> None:
    if use_shuffled_weight:
        raise ValueError("use_shuffled_weight=True (weights pre-shuffled for upstream's "
                         "trtllm-gen kernels) is not supported; pass use_shuffled_weight=False "
                         "with plain [E, 2I, H] / [E, H, I] weights")
    if int(weight_layout) != WeightLayout.MajorK:
        raise ValueError(f"weight_layout={weight_layout!r} is not supported; pass "
                         "weight_layout=WeightLayout.MajorK (0) with plain row-major weights")


def local(num_experts: int, local_expert_offset: int, local_num_experts: int,
           num_weights: int) -> None:
    if local_num_experts != num_weights:
        raise ValueError(f"local_num_experts={local_num_experts} does not match the "
                         f"{num_weights} experts of gemm1_weights")
    if local_expert_offset < 0 or local_expert_offset + local_num_experts > num_experts:
        raise ValueError(f"local_expert_offset={local_expert_offset} + local_num_experts="
                         f"{local_num_experts} exceeds num_experts={num_experts}")


def output(output, shape, dtype, device) -> torch.Tensor:
    if output is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"output must be a torch.Tensor, got {type(output).__name__}")
    if tuple(output.shape) != tuple(shape) or output.dtype != dtype or output.device != device:
        raise ValueError(f"output must be a {dtype} tensor of shape {tuple(shape)} on {device},"
                         f" got {output.dtype} {tuple(output.shape)} on {output.device}")
    if not output.is_contiguous():
        raise ValueError(f"output must be contiguous, got strides {output.stride()}")
    return output


def routing_logits(routing_logits, hidden: torch.Tensor, num_experts: int) -> None:
    if isinstance(routing_logits, torch.Tensor) and routing_logits.dim() == 2 and (
            routing_logits.shape[0] != hidden.shape[0]
            or routing_logits.shape[1] != num_experts):
        raise ValueError(f"routing_logits must be [num_tokens={hidden.shape[0]}, num_experts="
                         f"{num_experts}], got {tuple(routing_logits.shape)}")
