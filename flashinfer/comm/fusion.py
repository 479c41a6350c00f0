"""Fused all-reduce (upstream's ``flashinfer.comm.allreduce``): ``create_allreduce_fusion_workspace``
and ``allreduce_fusion`` with upstream's signatures, served by the dispatcher (op
``allreduce_fusion``, family ``comm``). The legacy TRT-LLM names (:mod:`.trtllm_ar`) and the vLLM
custom all-reduce port (:mod:`.vllm_ar`) run through :func:`run_fused` below, the same path.

Upstream's workspace is an IPC buffer its TRT-LLM kernels exchange data through; here it records
the process group and the sizes a call may use and, over an NCCL group, holds torch
symmetric-memory buffers of ``max_token_num x hidden_dim`` (the exchange area of the one-shot
kernels; ``FLASHINFER_COMM_SYMM_MEM=0`` leaves them out). The kernel is the Decision's. The
workspace type does not pick the backend (``FLASHINFER_COMM_BACKEND`` /
``use_backend(comm=...)`` do); ``"trtllm"`` and ``"auto"`` make the same workspace.

Canonical kernel signature (every backend registers exactly this)::

    kernel(input, group, symmetric, output, residual_in, residual_out, rms_gamma, norm_out,
           eps, weight_bias, quant, quant_out, scale_out, scale_factor, group_size) -> None

* ``input [T, H]`` fp16 / bf16 / fp32, this rank's contribution; ``group`` a
  ``torch.distributed`` process group; ``symmetric`` the workspace's symmetric buffers or None
  (their interface: backends/shared/symmetric_memory.py);
* ``output [T, H]`` (or None): the sum over the group's ranks, rounded once to the dtype;
* with ``residual_in [T, H]``: ``residual_out <- round(sum + residual_in)`` and
  ``y <- round(rmsnorm(residual_out) * (rms_gamma + weight_bias))`` (the sum in fp32, the norm of
  the rounded residual, as :mod:`flashinfer.norm` normalises its fused sum), stored to
  ``norm_out`` when it is given (the patterns without a norm output pass None);
* ``quant`` is None or the feature naming how ``y`` (as rounded to the dtype) becomes
  ``quant_out [T, H]`` float8_e4m3fn. Every code is clamped to +-448 (e4m3's largest finite,
  as a saturating cast) and rounded to nearest even:

  - ``"fp8_quant"``: ``q = y * (1 / scale_factor)``, ``scale_factor`` an fp32 ``[1]`` tensor on
    the input's device or a Python float (nothing copied to the device per call), the
    reciprocal taken in fp32 (upstream's per-tensor recipe: the scale is the dequantisation
    scale, ``y ~ q * scale_factor``); ``scale_out`` None;
  - ``"fp8_dynamic_quant"``: per token ``s = max(amax|y| / 448, 2**-9 / 448)`` (fp32) into
    ``scale_out [T, 1]`` fp32, ``q = y / s``;
  - ``"fp8_group_quant"``: per token and per group of ``group_size`` consecutive columns
    (``G = H / group_size`` groups), ``s = max(amax|y| / 448, 1e-10)`` rounded up to a power of
    two (a UE8M0 scale), ``q = y / s``. ``scale_out`` is int32 ``[T, K]``, ``K = ceil(G / 4)``,
    with strides ``(1, M)``, ``M = round_up(T, 4)`` (column-major, TMA-aligned: DeepGEMM's
    packed-scale layout; make it with ``torch.empty_strided((T, K), (1, M), dtype=torch.int32)``).
    Group ``g``'s 8-bit exponent (``s = 2**(e - 127)``) is byte ``g % 4`` (little-endian) of
    element ``[t, g // 4]``; the bytes after the last group and rows ``T..M-1`` of columns
    ``0..K-2`` (the storage between columns) are zeroed.

Patterns (``AllReduceFusionPattern``): 0, 1, 2, 4, 8, 9, 10 and 11 run; NVFP4 (3, 5) and the MoE
fusions (6, 7) are refused by name, saying what to call instead.

Dispatch Problem: dtype ``input``, shape facts ``world_size``, ``hidden_dim``, ``num_tokens``
(bucketed to a power of two) and ``symmetric_workspace`` (1 when the call's workspace holds
symmetric buffers, which the one-shot records require), features ``residual_rmsnorm``,
``gemma_weight`` (``weight_bias != 0``) and the quantisation's feature; the device is the
input's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Optional, Union

import torch

from .. import dispatch
from ..api_logging import flashinfer_api
from ..backends.shared.symmetric_memory import make_symmetric_buffers
from ..dispatch import Problem

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8 = torch.float8_e4m3fn


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


class QuantizationSFLayout(IntEnum):
    """Upstream's NVFP4 scale-factor layouts (``layout_code``): 128x4 / 8x4 swizzled tiles or
    row-major. Only the NVFP4 patterns read it; they are refused here, so it is checked and
    otherwise ignored (vLLM passes it with every pattern)."""

    SWIZZLED_128x4 = 0
    SWIZZLED_8x4 = 1
    LINEAR = 2


P = AllReduceFusionPattern


@dataclass(frozen=True)
class PatternSpec:
    """What a served pattern computes: the residual add + RMSNorm, the quantisation (a feature
    name, see the module note) and whether ``norm_out`` is written."""

    residual: bool
    quant: Optional[str]
    norm_out: bool


SERVED = {
    P.kAllReduce: PatternSpec(False, None, False),
    P.kARResidualRMSNorm: PatternSpec(True, None, True),
    P.kARResidualRMSNormFP8Quant: PatternSpec(True, "fp8_quant", False),
    P.kARResidualRMSNormOutFP8Quant: PatternSpec(True, "fp8_quant", True),
    P.kARResidualRMSNormPerTokenGroupFP8PackedQuant: PatternSpec(True, "fp8_group_quant", False),
    P.kARResidualRMSNormOutPerTokenGroupFP8PackedQuant: PatternSpec(True, "fp8_group_quant", True),
    P.kARResidualRMSNormDynamicFP8Quant: PatternSpec(True, "fp8_dynamic_quant", False),
    P.kARResidualRMSNormOutDynamicFP8Quant: PatternSpec(True, "fp8_dynamic_quant", True),
}
#: the patterns a kernel here serves
SERVED_PATTERNS = tuple(SERVED)

_FP4 = ("NVFP4 quantisation is not implemented; run kARResidualRMSNorm and quantise norm_out "
        "with flashinfer.fp4_quantize, or use an FP8 pattern (2, 4, 8-11)")
REFUSED = {
    P.kARResidualRMSNormFP4Quant: _FP4,
    P.kARResidualRMSNormOutFP4Quant: _FP4,
    P.kMoEReductionARResidualRMSNorm: (
        "the MoE-reduction fusion is not implemented; sum the experts' outputs per token "
        "(scale * expert output, plus the token input) first, then call kARResidualRMSNorm"),
    P.kMoEFinalizeARResidualRMSNorm: (
        "the MoE-finalize fusion is not implemented; finalise the MoE output first (gather and "
        "scale the top-k rows, add the shared expert output), then call kARResidualRMSNorm"),
}

#: the quantisation kinds that need each quantisation argument (other patterns ignore it)
_TAKES = {
    "quant_out": ("fp8_quant", "fp8_group_quant", "fp8_dynamic_quant"),
    "scale_factor": ("fp8_quant",),
    "scale_out": ("fp8_group_quant", "fp8_dynamic_quant"),
    "block_quant_group_size": ("fp8_group_quant",),
}

def _distributed():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashinfer.comm needs an initialised torch.distributed process group "
                           "(torch.distributed.init_process_group)")
    return dist


def resolve_group(group, world_size: int, rank: int, what: str):
    """``group`` (None: the world) after checking ``world_size`` / ``rank`` against it."""
    dist = _distributed()
    group = dist.group.WORLD if group is None else group
    actual_size, actual_rank = dist.get_world_size(group), dist.get_rank(group)
    if world_size != actual_size or rank != actual_rank:
        raise ValueError(f"{what}: world_size={world_size}, rank={rank} do not match the process "
                         f"group (size {actual_size}, this rank {actual_rank})")
    return group


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class AllReduceFusionWorkspace:
    """What an ``allreduce_fusion`` call may use: the process group (``group``, default the
    world), this rank, the largest ``max_token_num x hidden_dim`` of ``dtype`` a call may
    reduce, and ``symmetric``: the symmetric buffers of that size (None, with the reason in
    ``symmetric_note``, when the group is not NCCL on GPUs or torch symmetric memory is off or
    failed). Collective: every rank of the group makes it with the same sizes. ``destroy()``
    releases it (calls after that are refused)."""

    def __init__(self, world_size: int, rank: int, max_token_num: int, hidden_dim: int,
                 dtype: torch.dtype, group=None) -> None:
        for name, value in (("world_size", world_size), ("max_token_num", max_token_num),
                            ("hidden_dim", hidden_dim)):
            positive_int(name, value)
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
        self.group = resolve_group(group, world_size, rank, "AllReduceFusionWorkspace")
        self.world_size, self.rank = world_size, rank
        self.max_token_num, self.hidden_dim, self.dtype = max_token_num, hidden_dim, dtype
        self.symmetric, self.symmetric_note = make_symmetric_buffers(
            self.group, max_token_num * hidden_dim, dtype)
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
        self.symmetric = None


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


# --------------------------------------------------------------------------------------------
# argument checks


def _tensor_like(name: str, t, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
        raise ValueError(f"{name} must be {like.dtype} {list(like.shape)} on {like.device} like "
                         f"input, got {t.dtype} {list(t.shape)} on {t.device}")
    return t


def _tensor_of(name: str, t, dtype: torch.dtype, shape: tuple, device: torch.device,
               why: str) -> torch.Tensor:
    """``t`` if it is a ``dtype`` tensor of ``shape`` on ``device`` (TypeError for the dtype,
    ValueError for the shape or device); ``why`` says which pattern wants it so."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor ({why}), got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype} ({why}), got {t.dtype}")
    if tuple(t.shape) != tuple(shape) or t.device != device:
        raise ValueError(f"{name} must be {list(shape)} on {device} ({why}), got "
                         f"{list(t.shape)} on {t.device}")
    return t


def check_pattern(pattern) -> AllReduceFusionPattern:
    """The pattern code, or the error saying why it does not run here."""
    try:
        code = AllReduceFusionPattern(int(pattern))
    except (TypeError, ValueError):
        raise ValueError(f"pattern must be an AllReduceFusionPattern code (0-11), got "
                         f"{pattern!r}") from None
    if code in REFUSED:
        raise NotImplementedError(
            f"pattern {code.name} ({int(code)}) has no kernel here: {REFUSED[code]}. Served: "
            f"{', '.join(f'{p.name} ({int(p)})' for p in SERVED_PATTERNS)}")
    return code


def _scale_factor(value, input: torch.Tensor) -> Union[torch.Tensor, float]:
    """The per-tensor fp8 scale: a tensor as an fp32 ``[1]`` tensor on the input's device, a
    number as a float (no per-call copy to the device: no host sync, capturable)."""
    if isinstance(value, torch.Tensor):
        if not value.dtype.is_floating_point or value.dtype.itemsize == 1:
            raise TypeError(f"scale_factor must be a float16/bfloat16/float32/float64 tensor or "
                            f"a float, got a {value.dtype} tensor")
        if value.numel() != 1 or value.device != input.device:
            raise ValueError(f"scale_factor must hold one value on {input.device}, got "
                             f"{list(value.shape)} on {value.device}")
        return value.reshape(1).to(torch.float32)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"scale_factor must be a float or a one-element tensor, got "
                        f"{type(value).__name__}")
    if not 0 < value < math.inf:
        raise ValueError(f"scale_factor must be a finite number > 0, got {value!r}")
    return float(value)


def group_scale_layout(tokens: int, hidden: int, group_size: int) -> tuple[tuple, tuple]:
    """``(shape, strides)`` of the per-token-group patterns' packed int32 ``scale_out``."""
    packs = (hidden // group_size + 3) // 4
    return (tokens, packs), (1, (tokens + 3) // 4 * 4)


def _group_scale_out(scale_out, input: torch.Tensor, group_size) -> torch.Tensor:
    tokens, hidden = input.shape
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 \
            or hidden % group_size:
        raise ValueError(f"block_quant_group_size must be a positive int dividing hidden_dim="
                         f"{hidden}, got {group_size!r}")
    shape, strides = group_scale_layout(tokens, hidden, group_size)
    why = f"UE8M0 exponents of {hidden // group_size} groups of {group_size}, packed by four"
    _tensor_of("scale_out", scale_out, torch.int32, shape, input.device, why)
    row_ok = tokens == 1 or scale_out.stride(0) == 1
    column_ok = shape[1] == 1 or scale_out.stride(1) == strides[1]  # (one column: any stride)
    if not (row_ok and column_ok):
        raise ValueError(f"scale_out must have strides {strides} (column-major, rows padded to "
                         f"a multiple of 4: torch.empty_strided({shape}, {strides}, "
                         f"dtype=torch.int32)), got {scale_out.stride()}")
    return scale_out


def _quant_args(code: AllReduceFusionPattern, input: torch.Tensor, quant_out, scale_out,
                scale_factor, group_size) -> tuple:
    """``(quant_out, scale_out, scale_factor, group_size)`` as the kernel takes them."""
    quant = SERVED[code].quant
    given = {"quant_out": quant_out, "scale_factor": scale_factor, "scale_out": scale_out,
             "block_quant_group_size": group_size}
    for name, value in given.items():  # (one a pattern does not use is ignored, as upstream)
        if value is None and quant in _TAKES[name]:
            raise ValueError(f"{code.name} needs {name}")
    if quant is None:
        return None, None, None, 0
    tokens, hidden = input.shape
    _tensor_of("quant_out", quant_out, FP8, (tokens, hidden), input.device,
               "the fp8 e4m3 codes of the normed output")
    if quant == "fp8_quant":
        return quant_out, None, _scale_factor(scale_factor, input), 0
    if quant == "fp8_dynamic_quant":
        _tensor_of("scale_out", scale_out, torch.float32, (tokens, 1), input.device,
                   "one dynamic fp8 scale per token")
        return quant_out, scale_out, None, 0
    return quant_out, _group_scale_out(scale_out, input, group_size), None, group_size


# --------------------------------------------------------------------------------------------
# the shared path


def _decision(input: torch.Tensor, world_size: int, symmetric: bool, residual: bool,
              gemma: bool, quant: Optional[str]) -> dispatch.Decision:
    tokens, hidden = input.shape
    rows = dispatch.length_bucket(tokens)

    def problem() -> Problem:
        features = [n for n, used in (("residual_rmsnorm", residual), ("gemma_weight", gemma))
                    if used] + ([quant] if quant else [])
        return Problem.make("allreduce_fusion", input.device, dtypes={"input": input.dtype},
                            shape={"world_size": world_size, "hidden_dim": hidden,
                                   "num_tokens": rows, "symmetric_workspace": int(symmetric)},
                            features=features)

    key = ("allreduce_fusion", input.device, input.dtype, world_size, hidden, rows, symmetric,
           residual, gemma, quant)
    return dispatch.decide_keyed(key, problem, "auto")


def run_fused(code: AllReduceFusionPattern, input: torch.Tensor, group, world_size: int, *,
              output=None, residual_out=None, norm_out=None, quant_out=None, scale_out=None,
              residual_in=None, rms_gamma=None, rms_eps: float = 1e-6, scale_factor=None,
              layout_code=None, block_quant_group_size=None, weight_bias: float = 0.0,
              symmetric=None) -> torch.Tensor:
    """Check the arguments of served pattern ``code`` on ``input [T, H]``, decide, run the
    kernel over ``group`` (of ``world_size`` ranks; ``symmetric``: the workspace's symmetric
    buffers, when it has them); return upstream's result tensor: ``output`` for kAllReduce,
    else ``norm_out`` when there is one, else ``quant_out``. The entry points check their
    workspace, then call this."""
    spec = SERVED[code]
    if not isinstance(input, torch.Tensor) or input.dim() != 2:
        raise ValueError(f"input must be a 2-D [token_num, hidden_dim] tensor, got "
                         f"{tuple(getattr(input, 'shape', ()))}")
    if input.dtype not in _DTYPES:
        raise TypeError(f"input must be float16, bfloat16 or float32, got {input.dtype}")
    if layout_code is not None and layout_code not in list(QuantizationSFLayout):
        raise ValueError(f"layout_code must be None or a QuantizationSFLayout code (0-2), got "
                         f"{layout_code!r}")
    quant_out, scale_out, scale, group_size = _quant_args(
        code, input, quant_out, scale_out, scale_factor, block_quant_group_size)
    if isinstance(rms_eps, bool) or not isinstance(rms_eps, (int, float)) \
            or not 0 <= rms_eps < math.inf:
        raise ValueError(f"rms_eps must be a finite number >= 0, got {rms_eps!r}")
    output = None if output is None else _tensor_like("output", output, input)
    if spec.residual:
        if residual_in is None or rms_gamma is None:
            raise ValueError(f"{code.name} needs residual_in and rms_gamma")
        _tensor_like("residual_in", residual_in, input)
        if (not isinstance(rms_gamma, torch.Tensor) or rms_gamma.shape != (input.shape[1],)
                or rms_gamma.device != input.device or rms_gamma.dtype not in _DTYPES):
            raise ValueError(f"rms_gamma must be a float tensor [{input.shape[1]}] on "
                             f"{input.device}")
        residual_out = (torch.empty_like(input) if residual_out is None
                        else _tensor_like("residual_out", residual_out, input))
        if norm_out is None and spec.norm_out:
            norm_out = torch.empty_like(input)
        elif norm_out is not None:
            _tensor_like("norm_out", norm_out, input)  # (returned unwritten without Out: upstream)
    else:
        residual_in = residual_out = rms_gamma = norm_out = None
        if output is None:
            output = torch.empty_like(input)
    decision = _decision(input, world_size, symmetric is not None, spec.residual,
                         float(weight_bias) != 0.0, spec.quant)
    decision.kernel(input, group, symmetric, output, residual_in, residual_out, rms_gamma,
                    norm_out if spec.norm_out else None, float(rms_eps), float(weight_bias),
                    spec.quant, quant_out, scale_out, scale, group_size)
    if not spec.residual:
        return output
    return norm_out if norm_out is not None else quant_out


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
    """All-reduce of ``input [T, H]`` (fp16 / bf16 / fp32) over the workspace's group, with the
    fusion ``pattern``; every rank calls it with the same shapes. Outputs are made when None.

    * ``kAllReduce`` (0): the sum into ``output``, returned.
    * residual patterns (1, 2, 4, 8-11) need ``residual_in [T, H]`` and ``rms_gamma [H]``:
      ``residual_out <- sum + residual_in``; ``y = RMSNorm(residual_out) * (rms_gamma +
      weight_bias)`` goes to ``norm_out`` for 1 and the ``Out`` variants (4, 9, 11).
    * the quantising ones write ``quant_out [T, H]`` float8_e4m3fn from ``y``: 2 / 4 with the
      per-tensor dequantisation scale ``scale_factor`` (float or one-element tensor;
      ``q = y / scale_factor``); 8 / 9 per token and group of ``block_quant_group_size`` columns
      with power-of-two scales packed into ``scale_out`` int32 (layout: the module note);
      10 / 11 with per-token scales into ``scale_out [T, 1]`` float32.

    Returns ``output`` for 0, else ``norm_out`` when it is given or written, else ``quant_out``
    (upstream's rule: a ``norm_out`` passed to 2 / 8 / 10 is returned unwritten). ``output``,
    when given to a residual pattern, also receives the sum (upstream leaves it). Quantisation
    arguments given to a pattern that does not use them are ignored (upstream's engines and
    tests pass them with every pattern); ``layout_code`` (NVFP4's) is accepted and ignored. ``launch_with_pdl``, ``trigger_completion_at_end``, ``use_oneshot`` and
    ``fp32_acc`` do not change the result (the sum is taken in fp32); the MoE arguments belong
    to the refused MoE patterns."""
    code = check_pattern(pattern)
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
    return run_fused(code, input, workspace.group, workspace.world_size, output=output,
                     residual_out=residual_out, norm_out=norm_out, quant_out=quant_out,
                     scale_out=scale_out, residual_in=residual_in, rms_gamma=rms_gamma,
                     rms_eps=rms_eps, scale_factor=scale_factor, layout_code=layout_code,
                     block_quant_group_size=block_quant_group_size, weight_bias=weight_bias,
                     symmetric=workspace.symmetric)


__all__ = ["AllReduceFusionPattern", "AllReduceFusionWorkspace", "MNNVLAllReduceFusionWorkspace",
           "QuantizationSFLayout", "TRTLLMAllReduceFusionWorkspace", "allreduce_fusion",
           "create_allreduce_fusion_workspace"]
