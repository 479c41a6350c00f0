"""Fused all-reduce (upstream's ``flashinfer.comm.allreduce``): ``create_allreduce_fusion_workspace``
and ``allreduce_fusion`` with upstream's signatures, served by the dispatcher (op
``allreduce_fusion``, family ``comm``).

Upstream's workspace is an IPC buffer its TRT-LLM kernels exchange data through; here it records
the process group and the sizes a call may use, and the kernel is the Decision's. The workspace
type does not pick the backend (``FLASHINFER_COMM_BACKEND`` / ``use_backend(comm=...)`` /
``backend=`` on the workspace do); ``"trtllm"`` and ``"auto"`` make the same workspace.

Canonical kernel signature (every backend registers exactly this)::

    kernel(input, group, output, residual_in, residual_out, rms_gamma, norm_out, eps,
           weight_bias) -> None

* ``input [T, H]`` fp16 / bf16 / fp32, this rank's contribution; ``group`` a
  ``torch.distributed`` process group;
* ``output [T, H]`` (or None): the sum over the group's ranks, rounded once to the dtype;
* with ``residual_in [T, H]``: ``residual_out <- round(sum + residual_in)`` and ``norm_out <-
  rmsnorm(residual_out) * (rms_gamma + weight_bias)`` (the sum in fp32, the norm of the
  rounded residual, as :mod:`flashinfer.norm` normalises its fused sum).

Patterns (``AllReduceFusionPattern``): ``kAllReduce`` (0) and ``kARResidualRMSNorm`` (1) run;
the quantising and MoE patterns are refused by name until a kernel serves them.

Dispatch Problem: dtype ``input``, shape facts ``world_size``, ``hidden_dim`` and
``num_tokens`` (bucketed to a power of two), features ``residual_rmsnorm`` and
``gemma_weight`` (``weight_bias != 0``); the device is the input's.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Optional, Union

import torch

from .. import dispatch
from ..api_logging import flashinfer_api
from ..dispatch import Problem

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class AllReduceFusionPattern(IntEnum):
    """Upstream's fusion pattern codes (``allreduce_fusion(pattern=...)``)."""

    kAllReduce = 0
    kARResidualRMSNorm = 1
    kARResidualRMSNormFP8Quant = 2
    kARResidualRMSNormFP4Quant = 3
    kARResidualRMSNormOutFP8Quant = 4
    kARResidualRMSNormOutFP4Quant = 5
    kMoEReductionARResidualRMSNorm = 6
    kMoEFinalizeARResidualRMSNorm = 7
    kARResidualRMSNormPerTokenGroupFP8PackedQuant = 8
    kARResidualRMSNormOutPerTokenGroupFP8PackedQuant = 9
    kARResidualRMSNormDynamicFP8Quant = 10
    kARResidualRMSNormOutDynamicFP8Quant = 11


#: the patterns a kernel here serves
SERVED_PATTERNS = (AllReduceFusionPattern.kAllReduce, AllReduceFusionPattern.kARResidualRMSNorm)


def _distributed():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashinfer.comm needs an initialised torch.distributed process group "
                           "(torch.distributed.init_process_group)")
    return dist


class AllReduceFusionWorkspace:
    """What an ``allreduce_fusion`` call may use: the process group (``group``, default the
    world), this rank, and the largest ``max_token_num x hidden_dim`` of ``dtype`` a call may
    reduce. ``destroy()`` releases it (calls after that are refused)."""

    def __init__(self, world_size: int, rank: int, max_token_num: int, hidden_dim: int,
                 dtype: torch.dtype, group=None) -> None:
        dist = _distributed()
        for name, value in (("world_size", world_size), ("max_token_num", max_token_num),
                            ("hidden_dim", hidden_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
        group = dist.group.WORLD if group is None else group
        actual_size, actual_rank = dist.get_world_size(group), dist.get_rank(group)
        if world_size != actual_size or rank != actual_rank:
            raise ValueError(f"world_size={world_size}, rank={rank} do not match the process "
                             f"group (size {actual_size}, this rank {actual_rank})")
        self.world_size, self.rank, self.group = world_size, rank, group
        self.max_token_num, self.hidden_dim, self.dtype = max_token_num, hidden_dim, dtype
        self._destroyed = False

    @property
    def backend(self) -> str:
        return "trtllm"  # (upstream's name of this workspace kind; the kernel is the Decision's)

    def is_buffer_size_sufficient(self, tp_size: int, num_tokens: int, hidden_dim: int,
                                  dtype: torch.dtype, use_oneshot=None) -> bool:
        """Whether a call of ``num_tokens x hidden_dim`` ``dtype`` over ``tp_size`` ranks fits."""
        need = num_tokens * hidden_dim * dtype.itemsize
        have = self.max_token_num * self.hidden_dim * self.dtype.itemsize
        return tp_size == self.world_size and need <= have

    def destroy(self) -> None:
        self._destroyed = True


class TRTLLMAllReduceFusionWorkspace(AllReduceFusionWorkspace):
    """Upstream's TRT-LLM workspace name: the same workspace (see the module note)."""

    def __init__(self, tp_size: int, tp_rank: int, max_token_num: int, hidden_dim: int,
                 dtype: torch.dtype = torch.float16, comm_backend=None, group=None) -> None:
        if comm_backend is not None:
            raise NotImplementedError("comm_backend (upstream's MPI / custom rendezvous) is not "
                                      "supported: pass a torch.distributed group")
        super().__init__(tp_size, tp_rank, max_token_num, hidden_dim, dtype, group)


class MNNVLAllReduceFusionWorkspace:
    """Upstream's multi-node NVLink workspace: refused (module :mod:`flashinfer.comm.mnnvl`)."""

    def __init__(self, *args, **kwargs) -> None:
        from .mnnvl import unsupported

        raise unsupported("MNNVLAllReduceFusionWorkspace")


@flashinfer_api
def create_allreduce_fusion_workspace(backend: str = "auto", world_size: int = None,
                                      rank: int = None, max_token_num: int = None,
                                      hidden_dim: int = None, dtype: torch.dtype = None,
                                      gpus_per_node: int = None, comm_backend=None,
                                      force_oneshot_support: bool = False,
                                      group=None) -> AllReduceFusionWorkspace:
    """The workspace of :func:`allreduce_fusion` calls of at most ``max_token_num x hidden_dim``
    ``dtype`` over ``group`` (default: the world). ``backend``: ``"auto"`` or ``"trtllm"``
    (the same workspace here); ``"mnnvl"`` is refused (NVLink multicast is not used here)."""
    if backend == "mnnvl":
        from .mnnvl import unsupported

        raise unsupported("create_allreduce_fusion_workspace(backend='mnnvl')")
    if backend not in ("auto", "trtllm"):
        raise ValueError(f"backend must be 'auto' or 'trtllm', got {backend!r}")
    return TRTLLMAllReduceFusionWorkspace(world_size, rank, max_token_num, hidden_dim,
                                          torch.float16 if dtype is None else dtype,
                                          comm_backend, group)


def _tensor_like(name: str, t, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
        raise ValueError(f"{name} must be {like.dtype} {list(like.shape)} on {like.device} like "
                         f"input, got {t.dtype} {list(t.shape)} on {t.device}")
    return t


def _check_pattern(pattern) -> AllReduceFusionPattern:
    try:
        code = AllReduceFusionPattern(int(pattern))
    except (TypeError, ValueError):
        raise ValueError(f"pattern must be an AllReduceFusionPattern code (0-11), got "
                         f"{pattern!r}") from None
    if code not in SERVED_PATTERNS:
        raise NotImplementedError(
            f"pattern {code.name} ({int(code)}) has no kernel here yet; served: "
            f"{', '.join(f'{p.name} ({int(p)})' for p in SERVED_PATTERNS)}")
    return code


def _decision(input: torch.Tensor, workspace: AllReduceFusionWorkspace, residual: bool,
              gemma: bool) -> dispatch.Decision:
    tokens, hidden = input.shape
    rows = dispatch.length_bucket(tokens)

    def problem() -> Problem:
        features = [n for n, used in (("residual_rmsnorm", residual), ("gemma_weight", gemma))
                    if used]
        return Problem.make("allreduce_fusion", input.device, dtypes={"input": input.dtype},
                            shape={"world_size": workspace.world_size, "hidden_dim": hidden,
                                   "num_tokens": rows}, features=features)

    key = ("allreduce_fusion", input.device, input.dtype, workspace.world_size, hidden, rows,
           residual, gemma)
    return dispatch.decide_keyed(key, problem, "auto")


@flashinfer_api
def allreduce_fusion(input: torch.Tensor, workspace: AllReduceFusionWorkspace, pattern: int,
                     launch_with_pdl: bool = False, trigger_completion_at_end: bool = True,
                     output: Optional[torch.Tensor] = None,
                     residual_out: Optional[torch.Tensor] = None,
                     norm_out: Optional[torch.Tensor] = None,
                     quant_out: Optional[torch.Tensor] = None,
                     scale_out: Optional[torch.Tensor] = None,
                     residual_in: Optional[torch.Tensor] = None,
                     rms_gamma: Optional[torch.Tensor] = None, rms_eps: float = 1e-6,
                     scale_factor: Optional[Union[torch.Tensor, float]] = None,
                     layout_code: Optional[int] = None, use_oneshot: Optional[bool] = None,
                     fp32_acc: bool = False, moe_reduction_device_num_experts=None,
                     moe_reduction_scale_input=None,
                     moe_reduction_active_experts_token_input=None,
                     moe_reduction_token_input=None, expanded_idx_to_permuted_idx=None,
                     expert_scale_factor=None, shared_expert_output=None,
                     block_quant_group_size=None, weight_bias: float = 0.0, *,
                     moe_finalize_backend: str = "trtllm") -> torch.Tensor:
    """All-reduce of ``input [T, H]`` over the workspace's group, with the fusion ``pattern``.

    ``kAllReduce``: the sum into ``output`` (made when None), returned. ``kARResidualRMSNorm``:
    ``residual_in [T, H]`` and ``rms_gamma [H]`` required; ``residual_out <- sum +
    residual_in`` and ``norm_out <- RMSNorm(residual_out) * (rms_gamma + weight_bias)`` (each
    made when None); ``norm_out`` returned. Every rank must call it with the same shapes.
    ``launch_with_pdl``, ``trigger_completion_at_end``, ``use_oneshot`` and ``fp32_acc`` are
    accepted and do not change the result (the sum is taken in fp32); the MoE arguments and
    ``moe_finalize_backend`` belong to the MoE patterns, which are refused."""
    code = _check_pattern(pattern)
    if not isinstance(workspace, AllReduceFusionWorkspace):
        raise TypeError(f"workspace must come from create_allreduce_fusion_workspace, got "
                        f"{type(workspace).__name__}")
    if workspace._destroyed:
        raise RuntimeError("this allreduce fusion workspace was destroyed")
    if not isinstance(input, torch.Tensor) or input.dim() != 2:
        raise ValueError(f"input must be a 2-D [token_num, hidden_dim] tensor, got "
                         f"{tuple(getattr(input, 'shape', ()))}")
    if input.dtype != workspace.dtype or input.shape[1] != workspace.hidden_dim:
        raise ValueError(f"input must be {workspace.dtype} [*, {workspace.hidden_dim}] as the "
                         f"workspace was made, got {input.dtype} {list(input.shape)}")
    if input.shape[0] > workspace.max_token_num:
        raise ValueError(f"input has {input.shape[0]} tokens, the workspace holds "
                         f"{workspace.max_token_num}")
    for name, value in (("quant_out", quant_out), ("scale_out", scale_out),
                        ("scale_factor", scale_factor), ("layout_code", layout_code),
                        ("block_quant_group_size", block_quant_group_size)):
        if value is not None:
            raise ValueError(f"{name} applies to the quantising patterns, not {code.name}")
    if isinstance(rms_eps, bool) or not isinstance(rms_eps, (int, float)) \
            or not 0 <= rms_eps < math.inf:
        raise ValueError(f"rms_eps must be a finite number >= 0, got {rms_eps!r}")
    residual = code == AllReduceFusionPattern.kARResidualRMSNorm
    if residual:
        if residual_in is None or rms_gamma is None:
            raise ValueError("kARResidualRMSNorm needs residual_in and rms_gamma")
        _tensor_like("residual_in", residual_in, input)
        if (not isinstance(rms_gamma, torch.Tensor) or rms_gamma.shape != (input.shape[1],)
                or rms_gamma.device != input.device or rms_gamma.dtype not in _DTYPES):
            raise ValueError(f"rms_gamma must be a float tensor [{input.shape[1]}] on "
                             f"{input.device}")
        residual_out = (torch.empty_like(input) if residual_out is None
                        else _tensor_like("residual_out", residual_out, input))
        norm_out = (torch.empty_like(input) if norm_out is None
                    else _tensor_like("norm_out", norm_out, input))
        output = None if output is None else _tensor_like("output", output, input)
    else:
        output = torch.empty_like(input) if output is None else _tensor_like("output", output, input)
    decision = _decision(input, workspace, residual, float(weight_bias) != 0.0)
    decision.kernel(input, workspace.group, output, residual_in if residual else None,
                    residual_out if residual else None, rms_gamma if residual else None,
                    norm_out if residual else None, float(rms_eps), float(weight_bias))
    return norm_out if residual else output


__all__ = ["AllReduceFusionPattern", "AllReduceFusionWorkspace", "MNNVLAllReduceFusionWorkspace",
           "TRTLLMAllReduceFusionWorkspace", "allreduce_fusion",
           "create_allreduce_fusion_workspace"]
