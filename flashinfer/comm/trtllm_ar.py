"""Upstream's legacy TRT-LLM all-reduce names (``flashinfer.comm.trtllm_ar``), with upstream's
signatures, on the fused all-reduce of :mod:`.fusion` (op ``allreduce_fusion``).

Upstream allocates IPC buffers that every rank's kernel reads and writes (one-shot / two-shot,
Lamport flags) and hands back their pointers. Here the all-reduce is ``torch.distributed``'s, so
there are no IPC buffers: the ``trtllm_create_ipc_workspace_*`` functions return

* ``ipc_handles``: an :class:`IpcHandles` list shaped like upstream's (one list of ``tp_size``
  entries per buffer: 7 for the custom all-reduce, 3 for the fusion) holding null pointers
  (0), and the :class:`TrtllmIpcWorkspace` that records the process group and the sizes;
* for the fusion, that record as the ``workspace_tensor`` which ``trtllm_allreduce_fusion``
  takes as ``workspace_ptrs``, and upstream's metadata dict with the sizes it would allocate.

Strategy, config, flag and PDL arguments are accepted and checked but do not change the result
(the sum is taken in fp32 and rounded once). The Lamport initialisers have no buffers to clear.
The MoE fusions are refused (NotImplementedError saying what to call instead).
"""

from __future__ import annotations

import warnings
from enum import IntEnum, IntFlag
from typing import List, Optional, Union

import torch

from ..api_logging import flashinfer_api
from .fusion import (
    REFUSED, AllReduceFusionPattern, QuantizationSFLayout, check_pattern, positive_int,
    resolve_group, run_fused,
)

P = AllReduceFusionPattern

# upstream's sizing constants (the metadata below reports the sizes they give)
OneShotMaxToken = 128
MAX_ALL_REDUCE_BLOCKS = 24
LamportTokenNumThreshold = 16
BarrierFlagCount = 256
MAX_COMM_SIZE = 2147483647 & ~((1 << 21) - 1)  # the int32 range, rounded down to 2 MiB


class AllReduceStrategyType(IntEnum):
    """``trtllm_custom_all_reduce(strategy_code=...)``: accepted, the result is the same."""

    NCCL = 0
    MIN_LATENCY = 1
    UB = 2
    AUTO = 3
    ONESHOT = 4
    TWOSHOT = 5
    LOWPRECISION = 6


class AllReduceStrategyConfig(IntFlag):
    """``trtllm_custom_all_reduce(config_code=...)`` bits: accepted, the result is the same."""

    USE_MEMCPY = 1 << 0
    PUSH_MODE = 1 << 1


class AllReduceFusionOp(IntEnum):
    """``trtllm_custom_all_reduce(fusion_op_code=...)``: NONE and RESIDUAL_RMS_NORM run."""

    NONE = 0
    RESIDUAL_RMS_NORM = 1
    LAST_PROCESS_FOR_UB = 2
    RESIDUAL_RMS_PREPOST_NORM = 3
    RESIDUAL_RMS_NORM_QUANT_FP8 = 4
    RESIDUAL_RMS_NORM_QUANT_NVFP4 = 5
    RESIDUAL_RMS_NORM_OUT_QUANT_FP8 = 6
    RESIDUAL_RMS_NORM_OUT_QUANT_NVFP4 = 7
    MOE_ALLREDUCE_RESIDUAL_RMS_NORM = 8
    MOE_FINALIZE_ALLREDUCE_RESIDUAL_RMS_NORM = 9


def _deprecated(name: str) -> None:
    warnings.warn(f"{name} is deprecated upstream; use flashinfer.comm.allreduce_fusion with "
                  "create_allreduce_fusion_workspace", DeprecationWarning, stacklevel=3)


class TrtllmIpcWorkspace:
    """What upstream's IPC workspace stands for here: the process group, this rank, the sizes
    a call may use, and the buffer sizes upstream would allocate (``sizes``, bytes)."""

    def __init__(self, kind: str, group, rank: int, tp_size: int, max_token_num: int,
                 hidden_dim: int, use_fp32_lamport: bool, sizes: dict) -> None:
        self.kind, self.group, self.rank, self.tp_size = kind, group, rank, tp_size
        self.max_token_num, self.hidden_dim = max_token_num, hidden_dim
        self.use_fp32_lamport, self.sizes = use_fp32_lamport, sizes
        self.destroyed = False

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else "live"
        return (f"TrtllmIpcWorkspace({self.kind}, rank {self.rank} of {self.tp_size}, "
                f"{self.max_token_num} x {self.hidden_dim}, {state})")


class IpcHandles(list):
    """Upstream's ``ipc_handles`` shape (per buffer, one pointer per rank), every pointer null:
    there are no IPC buffers. ``workspace`` is the record the destroy functions release."""

    def __init__(self, workspace: TrtllmIpcWorkspace, buffers: int) -> None:
        super().__init__([0] * workspace.tp_size for _ in range(buffers))
        self.workspace = workspace


_LIVE: list[TrtllmIpcWorkspace] = []  # the custom all-reduce's workspaces, newest last


def _make(kind: str, rank: int, tp_size: int, max_token_num: int, hidden_dim: int,
          use_fp32_lamport: bool, group, sizes: dict) -> TrtllmIpcWorkspace:
    for name, value in (("tp_size", tp_size), ("max_token_num", max_token_num),
                        ("hidden_dim", hidden_dim)):
        positive_int(name, value)
    group = resolve_group(group, tp_size, rank, kind)
    import torch.distributed as dist

    dist.barrier(group=group)  # (upstream's ranks meet here too)
    return TrtllmIpcWorkspace(kind, group, rank, tp_size, max_token_num, hidden_dim,
                              bool(use_fp32_lamport), sizes)


@flashinfer_api
def trtllm_create_ipc_workspace_for_all_reduce(rank: int, tp_size: int, max_token_num: int,
                                               hidden_dim,
                                               group=None) -> List[List[int]]:
    """The workspace of :func:`trtllm_custom_all_reduce` over ``group`` (default: the world):
    an :class:`IpcHandles` of upstream's 7 buffers, every pointer 0 (no IPC buffers here; the
    record keeps the group, and ``trtllm_custom_all_reduce`` finds it by ``tp_size`` /
    ``tp_rank``). Collective: every rank of the group calls it."""
    _deprecated("trtllm_create_ipc_workspace_for_all_reduce")
    buffer = tp_size * max_token_num * hidden_dim * 4
    flags = (MAX_ALL_REDUCE_BLOCKS + 1) * 4 * tp_size * 2
    lamport = tp_size * LamportTokenNumThreshold * tp_size * hidden_dim * 2
    ws = _make("all_reduce", rank, tp_size, max_token_num, hidden_dim, False, group,
               {"buffer_size": buffer, "flag_size": flags, "lamport_buffer_size": lamport})
    _LIVE.append(ws)
    return IpcHandles(ws, 7)


def _release(workspace, what: str) -> None:
    if not isinstance(workspace, IpcHandles):
        raise TypeError(f"{what} takes the ipc_handles its create function returned, got "
                        f"{type(workspace).__name__}")
    workspace.workspace.destroyed = True
    if workspace.workspace in _LIVE:
        _LIVE.remove(workspace.workspace)


@flashinfer_api
def trtllm_destroy_ipc_workspace_for_all_reduce(workspace: List[List[int]],
                                                group=None) -> None:
    """Release a :func:`trtllm_create_ipc_workspace_for_all_reduce` workspace (``group`` unused,
    as upstream)."""
    _release(workspace, "trtllm_destroy_ipc_workspace_for_all_reduce")


@flashinfer_api
def trtllm_create_ipc_workspace_for_all_reduce_fusion(
        tp_rank: int, tp_size: int, max_token_num: int, hidden_dim, use_fp32_lamport: bool = False,
        group=None, create_metadata: bool = False, comm_backend=None,
        use_symm_dev_mem: bool = False) -> tuple:
    """The workspace of :func:`trtllm_allreduce_fusion` over ``group`` (default: the world), for
    calls of at most ``max_token_num x hidden_dim`` (fp32 inputs with ``use_fp32_lamport``).

    Returns, as upstream: ``(ipc_handles, workspace)``; with ``create_metadata``
    ``(ipc_handles, workspace, metadata)``; with ``use_symm_dev_mem`` too ``(ipc_handles,
    workspace, mem_handles, metadata)``. Here ``ipc_handles`` holds null pointers (3 buffers),
    ``workspace`` is the :class:`TrtllmIpcWorkspace` record to pass as ``workspace_ptrs``,
    ``mem_handles`` is empty (no symmetric memory) and ``metadata`` carries upstream's keys and
    sizes. Collective: every rank of the group calls it."""
    _deprecated("trtllm_create_ipc_workspace_for_all_reduce_fusion")
    if comm_backend is not None:
        raise NotImplementedError("comm_backend (upstream's MPI / custom rendezvous) is not "
                                  "supported: pass a torch.distributed group")
    if use_symm_dev_mem and not create_metadata:
        raise ValueError("use_symm_dev_mem is only supported with create_metadata=True")
    element = 4 if use_fp32_lamport else 2
    lamport_comm = min(tp_size * max_token_num * hidden_dim * element, MAX_COMM_SIZE)
    sizes = {"buffer_size": tp_size * max_token_num * hidden_dim * 2,
             "flag_size": tp_size * BarrierFlagCount * 4, "lamport_comm_size": lamport_comm,
             "lamport_buffer_size": lamport_comm * 3}
    ws = _make("all_reduce_fusion", tp_rank, tp_size, max_token_num, hidden_dim,
               use_fp32_lamport, group, sizes)
    handles = IpcHandles(ws, 3)
    if not create_metadata:
        return handles, ws
    metadata = {"tp_rank": tp_rank, "tp_size": tp_size, "max_token_num": max_token_num,
                "hidden_dim": hidden_dim, "use_fp32_lamport": bool(use_fp32_lamport), **sizes}
    return (handles, ws, [], metadata) if use_symm_dev_mem else (handles, ws, metadata)


@flashinfer_api
def trtllm_destroy_ipc_workspace_for_all_reduce_fusion(workspace: List[List[int]],
                                                       group=None) -> None:
    """Release a :func:`trtllm_create_ipc_workspace_for_all_reduce_fusion` workspace (pass its
    ``ipc_handles``; ``group`` unused, as upstream)."""
    _release(workspace, "trtllm_destroy_ipc_workspace_for_all_reduce_fusion")


def compute_fp4_swizzled_layout_sf_size(total_row: int, total_column: int) -> int:
    """Elements of an NVFP4 scale-factor matrix in the 128x4 swizzled layout: rows padded to a
    multiple of 128, columns to a multiple of 4."""
    return -(-total_row // 128) * 128 * (-(-total_column // 4) * 4)


def _check_lamport(size, dtype) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be an int >= 0, got {size!r}")
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")


def trtllm_lamport_initialize(buffer_ptr: int, size: int, dtype: torch.dtype) -> None:
    """Upstream fills a Lamport buffer with negative zeros. There are no Lamport buffers here:
    the arguments are checked and nothing else happens."""
    _check_lamport(size, dtype)


def trtllm_lamport_initialize_all(buffer_0_ptr: int, buffer_1_ptr: int, buffer_2_ptr: int,
                                  size: int, dtype: torch.dtype) -> None:
    """:func:`trtllm_lamport_initialize` of three buffers: checked, nothing else happens."""
    _check_lamport(size, dtype)


def _rows(name: str, t, tokens: int, hidden: int) -> Optional[torch.Tensor]:
    """``t`` (flat, or any shape of ``tokens * hidden`` elements) viewed as ``[tokens, hidden]``."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.numel() != tokens * hidden:
        raise ValueError(f"{name} must hold token_num * hidden_dim = {tokens} * {hidden} "
                         f"elements, got {list(t.shape)}")
    try:
        return t.view(tokens, hidden)
    except RuntimeError:
        raise ValueError(f"{name} must be contiguous (it is viewed as [{tokens}, {hidden}]), "
                         f"got strides {t.stride()}") from None


def _fusion_workspace(workspace_ptrs, world_size: int, world_rank: int) -> TrtllmIpcWorkspace:
    if not isinstance(workspace_ptrs, TrtllmIpcWorkspace) or workspace_ptrs.kind != \
            "all_reduce_fusion":
        raise TypeError("workspace_ptrs must be the workspace that "
                        "trtllm_create_ipc_workspace_for_all_reduce_fusion returned (second "
                        f"element; no IPC pointers here), got {type(workspace_ptrs).__name__}")
    ws = workspace_ptrs
    if ws.destroyed:
        raise RuntimeError("this all-reduce fusion workspace was destroyed")
    if (world_size, world_rank) != (ws.tp_size, ws.rank):
        raise ValueError(f"world_size={world_size}, world_rank={world_rank} do not match the "
                         f"workspace (tp_size {ws.tp_size}, rank {ws.rank})")
    return ws


@flashinfer_api
def trtllm_allreduce_fusion(allreduce_in: torch.Tensor, world_size: int, world_rank: int,
                            token_num: int, hidden_dim: int, workspace_ptrs, launch_with_pdl: bool,
                            trigger_completion_at_end: bool, fp32_acc: bool,
                            pattern_code: AllReduceFusionPattern, use_oneshot: Optional[bool],
                            allreduce_out: Optional[torch.Tensor],
                            residual_in: Optional[torch.Tensor],
                            residual_out: Optional[torch.Tensor],
                            norm_out: Optional[torch.Tensor], quant_out: Optional[torch.Tensor],
                            scale_out: Optional[torch.Tensor], rms_gamma: Optional[torch.Tensor],
                            rms_eps: Optional[float],
                            scale_factor: Optional[Union[torch.Tensor, float]],
                            layout_code: Optional[QuantizationSFLayout],
                            metadata: Optional[dict] = None,
                            block_quant_group_size: Optional[int] = None,
                            weight_bias: Optional[float] = None) -> None:
    """Upstream's flat-tensor form of :func:`flashinfer.comm.allreduce_fusion`: the tensors hold
    ``token_num * hidden_dim`` elements each (flat or 2-D; ``quant_out`` float8_e4m3fn,
    ``scale_out`` as the pattern takes it, not reshaped), ``workspace_ptrs`` is the record of
    :func:`trtllm_create_ipc_workspace_for_all_reduce_fusion`. Outputs are written in place
    (the residual patterns need ``residual_out``; the Out variants and 1 need ``norm_out``).
    ``rms_eps`` / ``weight_bias`` None mean 0, as upstream's kernel takes them. With
    ``metadata``, the call is checked against it as upstream does (sizes, fp32 Lamport)."""
    _deprecated("trtllm_allreduce_fusion")
    code = check_pattern(pattern_code)
    ws = _fusion_workspace(workspace_ptrs, world_size, world_rank)
    positive_int("token_num", token_num)
    positive_int("hidden_dim", hidden_dim)
    if token_num * hidden_dim > ws.max_token_num * ws.hidden_dim:
        raise ValueError(f"token_num * hidden_dim = {token_num} * {hidden_dim} exceeds the "
                         f"workspace's {ws.max_token_num} * {ws.hidden_dim}")
    if code != P.kAllReduce and residual_out is None:
        raise ValueError(f"{code.name} needs residual_out (outputs are written in place)")
    if code in (P.kARResidualRMSNorm, P.kARResidualRMSNormOutFP8Quant,
                P.kARResidualRMSNormOutPerTokenGroupFP8PackedQuant,
                P.kARResidualRMSNormOutDynamicFP8Quant) and norm_out is None:
        raise ValueError(f"{code.name} needs norm_out (outputs are written in place)")
    if code == P.kAllReduce and allreduce_out is None:
        raise ValueError("kAllReduce needs allreduce_out (outputs are written in place)")
    rows = {name: _rows(name, t, token_num, hidden_dim) for name, t in (
        ("allreduce_in", allreduce_in), ("allreduce_out", allreduce_out),
        ("residual_in", residual_in), ("residual_out", residual_out), ("norm_out", norm_out),
        ("quant_out", quant_out))}
    x = rows["allreduce_in"]
    if metadata is not None:
        missing = [k for k in ("max_token_num", "tp_size", "hidden_dim", "use_fp32_lamport")
                   if k not in metadata]
        if missing:
            raise ValueError(f"workspace metadata is missing {missing}")
        if metadata["use_fp32_lamport"] != (x.dtype == torch.float32):
            raise ValueError(f"use_fp32_lamport={metadata['use_fp32_lamport']} does not match "
                             f"allreduce_in's dtype {x.dtype}")
    run_fused(code, x, ws.group, ws.tp_size, output=rows["allreduce_out"],
              residual_out=rows["residual_out"], norm_out=rows["norm_out"],
              quant_out=rows["quant_out"], scale_out=scale_out, residual_in=rows["residual_in"],
              rms_gamma=rms_gamma, rms_eps=0.0 if rms_eps is None else rms_eps,
              scale_factor=scale_factor, layout_code=layout_code,
              block_quant_group_size=block_quant_group_size,
              weight_bias=0.0 if weight_bias is None else weight_bias)


def _code(enum, name: str, value):
    """``value`` as a member of ``enum`` (an IntFlag: any combination of its bits)."""
    try:
        member = enum(int(value))
    except (TypeError, ValueError):
        member = None
    if member is None or (issubclass(enum, IntFlag) and int(value) & ~sum(map(int, enum))):
        allowed = ", ".join(f"{m.name}={int(m)}" for m in enum)
        raise ValueError(f"{name} must be one of {enum.__name__}'s codes ({allowed}), got "
                         f"{value!r}")
    return member


def _custom_group(tp_size: int, tp_rank: int):
    """The group of the newest live custom all-reduce workspace of this size and rank, else the
    world's when it matches."""
    for ws in reversed(_LIVE):
        if (ws.tp_size, ws.rank) == (tp_size, tp_rank):
            return ws.group
    return resolve_group(None, tp_size, tp_rank, "trtllm_custom_all_reduce (no live workspace "
                         "of this tp_size / tp_rank, so the world group)")


@flashinfer_api
def trtllm_custom_all_reduce(inp: torch.Tensor, out: torch.Tensor, tp_size: int, tp_rank: int,
                             token_num: int, fusion_op_code: AllReduceFusionOp,
                             strategy_code: AllReduceStrategyType,
                             config_code: AllReduceStrategyConfig, launch_with_pdl: bool,
                             flag_value: int, peer_comm_buffer_ptrs: torch.Tensor,
                             peer_barrier_ptrs_in: torch.Tensor,
                             peer_barrier_ptrs_out: torch.Tensor, bias: Optional[torch.Tensor],
                             residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                             weight_pre_residual_norm: Optional[torch.Tensor],
                             eps: Optional[float], intermediate_buffer: Optional[torch.Tensor],
                             lamport_peer_comm_buffer_ptrs_0: Optional[torch.Tensor],
                             lamport_peer_comm_buffer_ptrs_1: Optional[torch.Tensor],
                             lamport_peer_comm_buffer_ptrs_2: Optional[torch.Tensor]) -> None:
    """Upstream's custom all-reduce of ``inp`` (``token_num`` rows, flat or not; fp16 / bf16 /
    fp32) into ``out`` (same dtype and size), over the group of the live
    :func:`trtllm_create_ipc_workspace_for_all_reduce` workspace of this ``tp_size`` /
    ``tp_rank`` (else the world). The pointer tensors, strategy, config and flag are not used.

    * ``NONE``: ``out <- sum`` (``bias``, ``residual``, ``weight`` ignored, as upstream).
    * ``RESIDUAL_RMS_NORM``: ``intermediate_buffer <- sum + residual (+ bias [H])`` (when given)
      and ``out <- RMSNorm(that) * weight`` (``eps`` None: 1e-5, upstream's default). With a bias,
      ``residual + bias`` is rounded to the dtype once before the sum is added (upstream adds
      all three in fp32). ``weight_pre_residual_norm`` is not used.

    The other fusion ops raise NotImplementedError."""
    _deprecated("trtllm_custom_all_reduce")
    op = _code(AllReduceFusionOp, "fusion_op_code", fusion_op_code)
    _code(AllReduceStrategyType, "strategy_code", strategy_code)
    _code(AllReduceStrategyConfig, "config_code", config_code)
    if op not in (AllReduceFusionOp.NONE, AllReduceFusionOp.RESIDUAL_RMS_NORM):
        raise NotImplementedError(
            f"trtllm_custom_all_reduce: fusion op {op.name} has no kernel here; NONE and "
            "RESIDUAL_RMS_NORM run, and flashinfer.comm.allreduce_fusion serves the fp8 "
            "quantising patterns")
    for name, t in (("inp", inp), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    positive_int("token_num", token_num)
    if out.dtype != inp.dtype or out.numel() != inp.numel() or inp.numel() % token_num:
        raise ValueError(f"inp and out must have one dtype and size, a multiple of token_num="
                         f"{token_num}; got {inp.dtype} {list(inp.shape)} and {out.dtype} "
                         f"{list(out.shape)}")
    hidden = inp.numel() // token_num
    group = _custom_group(tp_size, tp_rank)
    x, o = _rows("inp", inp, token_num, hidden), _rows("out", out, token_num, hidden)
    if op == AllReduceFusionOp.NONE:
        run_fused(P.kAllReduce, x, group, tp_size, output=o)
        return
    if residual is None or weight is None:
        raise ValueError("RESIDUAL_RMS_NORM needs residual and weight")
    res = _rows("residual", residual, token_num, hidden)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.numel() != hidden:
            raise ValueError(f"bias must be a tensor of hidden_size={hidden} elements")
        res = (res.float() + bias.reshape(hidden).float()).to(res.dtype)
    run_fused(P.kARResidualRMSNorm, x, group, tp_size, norm_out=o, residual_in=res,
              residual_out=_rows("intermediate_buffer", intermediate_buffer, token_num, hidden),
              rms_gamma=weight, rms_eps=1e-5 if eps is None else eps)


def _moe_refusal(name: str, pattern: AllReduceFusionPattern) -> NotImplementedError:
    return NotImplementedError(f"{name}: {REFUSED[pattern]}")


def trtllm_moe_allreduce_fusion(world_size: int, world_rank: int, token_num: int,
                                hidden_dim: int, workspace_ptrs, launch_with_pdl: bool,
                                residual_in: torch.Tensor, rms_gamma: torch.Tensor,
                                rms_eps: float, scale_factor: float,
                                moe_reduction_device_num_experts: int,
                                moe_reduction_scale_input: torch.Tensor,
                                moe_reduction_active_experts_token_input: torch.Tensor,
                                moe_reduction_token_input: torch.Tensor,
                                layout_code: Optional[QuantizationSFLayout],
                                moe_allreduce_out: Optional[torch.Tensor],
                                residual_out: Optional[torch.Tensor],
                                norm_out: Optional[torch.Tensor],
                                quant_out: Optional[torch.Tensor],
                                scale_out: Optional[torch.Tensor],
                                weight_bias: Optional[float] = None) -> None:
    """Upstream's MoE-reduction + all-reduce + RMSNorm fusion: refused (NotImplementedError)."""
    raise _moe_refusal("trtllm_moe_allreduce_fusion", P.kMoEReductionARResidualRMSNorm)


def trtllm_moe_finalize_allreduce_fusion(allreduce_in: torch.Tensor, residual_in: torch.Tensor,
                                         norm_weight: torch.Tensor,
                                         expanded_idx_to_permuted_idx: torch.Tensor,
                                         norm_out: Optional[torch.Tensor],
                                         residual_out: Optional[torch.Tensor],
                                         quant_out: Optional[torch.Tensor],
                                         scale_out: Optional[torch.Tensor], workspace_ptrs,
                                         launch_with_pdl: bool, world_rank: int, world_size: int,
                                         eps: float, shared_expert_output: Optional[torch.Tensor],
                                         expert_scale_factor: Optional[torch.Tensor],
                                         routed_scaling_factor: Optional[float],
                                         weight_bias: Optional[float] = None) -> None:
    """Upstream's MoE-finalize + all-reduce + RMSNorm fusion: refused (NotImplementedError)."""
    raise _moe_refusal("trtllm_moe_finalize_allreduce_fusion", P.kMoEFinalizeARResidualRMSNorm)


__all__ = ["AllReduceFusionOp", "AllReduceFusionPattern", "AllReduceStrategyConfig",
           "AllReduceStrategyType", "IpcHandles", "QuantizationSFLayout",
           "TrtllmIpcWorkspace", "compute_fp4_swizzled_layout_sf_size", "trtllm_allreduce_fusion",
           "trtllm_create_ipc_workspace_for_all_reduce",
           "trtllm_create_ipc_workspace_for_all_reduce_fusion", "trtllm_custom_all_reduce",
           "trtllm_destroy_ipc_workspace_for_all_reduce",
           "trtllm_destroy_ipc_workspace_for_all_reduce_fusion", "trtllm_lamport_initialize",
           "trtllm_lamport_initialize_all", "trtllm_moe_allreduce_fusion",
           "trtllm_moe_finalize_allreduce_fusion"]
