"""Triton fused MoE (op ``fused_moe``): registration, alignment and launch configuration.

Kernel signature and semantics: :mod:`flashinfer.fused_moe.core`. The @triton.jit code lives
in ``_moe_kernels.py`` and is imported on first use (this module must import without Triton).

One call, never synchronising with the host (so it can be captured in a CUDA graph), and every
buffer sized from the shapes alone:

1. ``prepare`` (``align_kernel``, or three launches past ``ONE_PROGRAM_PAIRS`` pairs): the
   ``P = T * top_k`` (token, slot) pairs are
   stably sorted by local expert id (pairs of other ranks are dropped) and each expert's
   segment is padded to a multiple of ``BLOCK_M`` in a list of ``max_rows(P, E, BLOCK_M)`` rows
   (the sentinel ``P`` marks padding), with the expert of each M-block and the number of used
   blocks as a one-element device tensor; W8A8 quantises the input in spare programs of the
   same first launch; with ``spec.ids_fault`` (the caller's ids) the counting pass also reports
   ids no rank owns (outside ``[0, spec.num_experts_total)``) into the device's error record
   (:mod:`flashinfer.index_checks`), in the kernel: no extra launch, no host sync;
2. ``gemm1_kernel`` (grid: every possible M-block x column tiles of ``I``): gather the block's
   token rows, ``x @ w1[e].T`` for the up and gate halves at once, the gated activation, the
   intermediate ``[rows, I]`` in the activation dtype;
3. ``gemm2_kernel`` (grid: M-blocks x column tiles of ``H``): ``intermediate @ w2[e].T`` times
   the routing weight into a ``[T * top_k, H]`` buffer of per-pair rows (``_partial_dtype``);
4. ``finalize_kernel``: ``out[t]`` = the sum of token ``t``'s local rows in slot order, in
   float32, so results are deterministic; rows of other ranks' pairs are never written and
   never read (no zero fill).

Both GEMM grids are 1-D and walk groups of ``group_m`` M-blocks across all column tiles
(``_moe_kernels._tile_of``): without it, gemm2's intermediate rows (75 MB at 4,096 tokens of
DeepSeek-V3, more than L2) were read from memory again for each of the 56 column tiles.
A launch configuration with ``weights_tma`` loads the weight tiles through tensor descriptors
(the copy engine, SM 9.0+) instead of pointers; bit-identical under the interpreter, and on the
H200 within 1 % of the pointer loads at 16 to 4,096 tokens (gemm2 faster, gemm1 slower at
4,096; ``profile_moe_tune_h200_2026-11-30_2011utc.txt``), which does not pay for building two
descriptors on the host every call, so no entry of the launch table sets it.

Host time matters as much as GPU time below a few hundred tokens: an eager call from an idle
GPU waits for every Python step before gemm1's launch (on the H200's host a Triton launch costs
25-70 us and a torch allocation 5-30 us; at 16 tokens gemm1 started 0.47 ms into the call,
``probe_moe_timeline_h200_2026-11-30_2017utc.txt``). So the W8A8 input is quantised inside the
alignment's launch, small pair counts align in one program, and the alignment's three outputs
share one allocation.

FP8 128x128 block-scaled experts run W8A8 (DeepSeek-V3's recipe, as upstream's CUTLASS MoE):
the input is quantised to fp8 per token and 128-wide group once (in ``prepare``; taken as
given when it is fp8 with 1x128 scales), the intermediate tile by tile inside gemm2,
and both GEMMs multiply fp8 by fp8 (``_moe_kernels``).
So results differ from the torch backend and the reference, which keep bf16 activations, by the
fp8 rounding of the input and of the intermediate (a few percent, relative). Per-tensor fp8
experts keep bfloat16 activations (an fp8 input is dequantised first) and convert the weights in
the K loop. FP8 needs Triton's fp8 conversions, SM 8.9 and newer (``reasons``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from ...index_checks import record
from ...reasons import Reason
from .launch import device_of, fast, pow2

_QUANT = {"none": 0, "fp8_block_scale": 1, "fp8_per_tensor": 2}
#: pairs ranked at a time by ``align_kernel`` (a [ALIGN_CHUNK, experts] one-hot per step)
ALIGN_CHUNK = 64
#: up to this many pairs (16 tokens of top-8) one program aligns them, in one launch
ONE_PROGRAM_PAIRS = 2 * ALIGN_CHUNK
#: tokens per program when ``prepare`` quantises the input (one 128-wide group each)
QUANTISE_TOKENS = 16


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int
    block_n1: int  # gemm1 column tile (over I; two accumulators: up and gate)
    block_n2: int  # gemm2 column tile (over H)
    block_k: int   # divides 128: one K step stays inside one fp8 scale block (W8A8: == 128)
    warps1: int    # gemm1 warps and pipeline stages
    stages1: int
    warps2: int    # gemm2 warps and pipeline stages
    stages2: int
    group_m: int   # M-blocks walked together across the column tiles (see ``_tile_of``)
    weights_tma: bool = False  # weight tiles through tensor descriptors (``_weight_descriptors``)


def launch_config(num_pairs: int, num_experts: int, on_gpu: bool, w8a8: bool) -> LaunchConfig:
    """Tile sizes from the average rows per expert (shapes only, nothing read from the device).

    W8A8 (fp8 128x128 experts; gemm1 tiles must be one 128-wide scale group), set from
    ``benchmarks/profile_moe.py`` on the H200, DeepSeek-V3 layer:

    * ``BLOCK_M = 16`` up to 8 rows per expert (best at 1-256 tokens of top-8 over 256 experts;
      profile_moe_configs_h200_2026-11-30_0943utc.txt), 32 from 9 to 16 rows (the earlier
      table's tile there; not re-measured since);
    * beyond, ``BLOCK_M = 64`` with gemm1 on 8 warps / 3 stages and gemm2 on 4 warps: at 1,024
      tokens, every expert used, gemm1 2.17 ms and gemm2 0.97 ms against 2.25 / 1.18 with
      ``BLOCK_M = 32`` (gemm1 on 4 warps at ``BLOCK_M = 64``: 6.5 ms); at 4,096 tokens gemm2
      1.99 ms on 4 warps / 4 stages against 3.20 on 8 warps / 3
      (profile_moe_tiles_{1024,4096}_h200_2026-11-30_193{1,2}utc.txt,
      profile_moe_gemm2_h200_2026-11-30_1937utc.txt);
    * ``group_m = 8``: gemm2 at 4,096 tokens 3.20 ms against 3.61 in plain M-block order.

    Two-byte weights keep 64-wide gemm1 tiles (128-wide ones at BLOCK_M 64 with 3 stages need
    240 KB of shared memory, more than the H200's 227 KB), as tuned before on the same layer
    (benchmarks/results/tune_moe_w8a8_h200_2026-11-30.json)."""
    per_expert = num_pairs / max(num_experts, 1)
    if not on_gpu:  # the interpreter: small tiles, few programs
        return LaunchConfig(16, 128, 64, 128, 4, 1, 4, 1, 8)
    if not w8a8:
        return (LaunchConfig(16, 64, 128, 128, 4, 4, 4, 4, 8) if per_expert <= 32 else
                LaunchConfig(64, 64, 128, 128, 4, 3, 4, 3, 8))
    if per_expert <= 8:
        return LaunchConfig(16, 128, 128, 128, 4, 4, 4, 4, 8)
    if per_expert <= 16:
        return LaunchConfig(32, 128, 128, 128, 4, 4, 4, 4, 8)
    return LaunchConfig(64, 128, 128, 128, 8, 3, 4, 4, 8)


def max_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows of the padded list: every non-empty expert (at most ``min(E, P)`` of them) adds at
    most ``block_m - 1`` padding rows; rounded up to whole blocks."""
    rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-rows // block_m) * block_m


class Prepared(NamedTuple):
    """gemm1's inputs besides the weights (``prepare``)."""

    sorted_pairs: torch.Tensor  # [R] int32: pair indices by expert, blocks padded with T * k
    block_expert: torch.Tensor  # [R / block_m] int32: local expert of each M-block
    num_blocks: torch.Tensor    # [1] int32: M-blocks in use
    x_q: Optional[torch.Tensor]      # quantise: x in fp8 [T, H] (float32 under the interpreter)
    x_scale: Optional[torch.Tensor]  # quantise: its 1x128 scales, float32 [T, ceil(H/128)]


def prepare(ids: torch.Tensor, expert_offset: int, num_experts: int, block_m: int,
            quantise: Optional[torch.Tensor] = None,
            check: Optional[tuple[torch.Tensor, int, int]] = None) -> Prepared:
    """Align the ``(token, slot)`` pairs of ``ids [T, k]`` (int32 global expert ids) by local
    expert, ``R = max_rows(T * k, num_experts, block_m)`` rows, without a host sync; with
    ``quantise`` (W8A8: the half-precision input ``[T, H]``), also quantise it to fp8 per token
    and 128-wide group, in spare programs of the first launch (a launch from Python costs
    25-70 us of host time on the H200's host, so a decode step pays for each one).

    ``sorted_pairs`` holds flat pair indices ``token * k + slot`` grouped by expert (stable:
    ascending within an expert), each expert's group starting on a multiple of ``block_m``;
    padding and unused rows hold ``T * k``. Blocks ``>= num_blocks[0]`` are unused. Up to
    ``ONE_PROGRAM_PAIRS`` pairs one program aligns (``align_kernel``), past it three launches
    (count, offsets, scatter); the three outputs share one int32 allocation. ``check``: ``(error
    record, total, code)``: ids outside ``[0, total)`` are reported under fault ``code`` by the
    counting pass (they are left out of the list either way, as other ranks' ids)."""
    from . import _moe_kernels

    dev = ids.device
    num_pairs = ids.numel()
    rows = max_rows(num_pairs, num_experts, block_m)
    meta = torch.empty(rows + rows // block_m + 1, dtype=torch.int32, device=dev)
    sorted_pairs, block_expert = meta[:rows], meta[rows:-1]
    num_blocks = meta[-1:]
    x_q = x_scale = None
    q_args, q_tiles = (ids, ids, ids, 0, 0, 0, 0, 0, 0), 0
    on_gpu = ids.is_cuda
    if quantise is not None:
        tokens, hidden = quantise.shape
        x_q = torch.empty((tokens, hidden), device=dev,
                          dtype=torch.float8_e4m3fn if on_gpu else torch.float32)
        x_scale = torch.empty((tokens, -(-hidden // 128)), dtype=torch.float32, device=dev)
        q_args = (quantise, x_q, x_scale, tokens, hidden, quantise.stride(0), x_q.stride(0),
                  x_scale.stride(0), x_scale.stride(1))
        q_tiles = -(-tokens // QUANTISE_TOKENS) * x_scale.shape[1]
    quant_kw = dict(QUANTISE=q_tiles > 0, BLOCK_T=QUANTISE_TOKENS, DOT_F32=not on_gpu,
                    CHECK_IDS=check is not None)
    check_args = check if check is not None else (ids, 0, 0)
    flat = ids.contiguous().view(-1)
    ep = pow2(num_experts)
    if num_pairs == 0:  # no M-block in use: nothing reads the other outputs
        num_blocks.zero_()
    elif num_pairs <= ONE_PROGRAM_PAIRS:
        fast(_moe_kernels.align_kernel)[(1 + q_tiles,)](
            flat, sorted_pairs, block_expert, num_blocks, num_pairs, expert_offset, rows,
            *q_args, *check_args, NUM_EXPERTS=num_experts, EP=ep, BLOCK_M=block_m,
            CHUNK=ALIGN_CHUNK, **quant_kw, num_warps=8)
    else:
        n_chunks = -(-num_pairs // ALIGN_CHUNK)
        base = torch.empty((n_chunks, ep), dtype=torch.int32, device=dev)
        fast(_moe_kernels.align_count_kernel)[(n_chunks + q_tiles,)](
            flat, base, num_pairs, expert_offset, *q_args, *check_args, NUM_EXPERTS=num_experts,
            EP=ep, CHUNK=ALIGN_CHUNK, **quant_kw, num_warps=4)
        fast(_moe_kernels.align_offsets_kernel)[(1,)](
            base, block_expert, num_blocks, sorted_pairs, n_chunks, rows, num_pairs,
            NUM_EXPERTS=num_experts, EP=ep, BLOCK_M=block_m, CHUNK=ALIGN_CHUNK, GROUP=16,
            FILL=1024, num_warps=8)
        fast(_moe_kernels.align_scatter_kernel)[(n_chunks,)](
            flat, base, sorted_pairs, num_pairs, expert_offset, NUM_EXPERTS=num_experts, EP=ep,
            CHUNK=ALIGN_CHUNK, num_warps=4)
    return Prepared(sorted_pairs, block_expert, num_blocks, x_q, x_scale)




def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _activations(x: torch.Tensor, x_scale, w8a8: bool) -> torch.Tensor:
    """The gemm1 input: x itself (half precision, or fp8 with 1x128 scales under W8A8), or fp8 x
    dequantised to bfloat16."""
    if x.dtype in (torch.float16, torch.bfloat16) or (w8a8 and x_scale is not None):
        return _unit_stride(x)
    if x_scale is None:
        return x.to(torch.bfloat16)
    full = x_scale.float().repeat_interleave(128, -1)[:, : x.shape[1]]
    return (x.float() * full).to(torch.bfloat16)


def _scale_args(scale, quant: int, ref: torch.Tensor):
    """(tensor, stride_e, stride_n, stride_k): a dummy pointer when unquantised."""
    if quant == 0:
        return ref, 0, 0, 0
    if scale.dim() == 1:
        return scale, scale.stride(0), 0, 0
    if scale.dim() == 2:
        return scale, scale.stride(0), scale.stride(1), 0
    return scale, scale.stride(0), scale.stride(1), scale.stride(2)


def fused_moe(x, x_scale, w1, w1_scale, w2, w2_scale, ids, weights, spec, out) -> None:
    from . import _moe_kernels

    ids = ids.contiguous()  # finalize reads slot s of token t at t * top_k + s
    num_tokens, top_k = ids.shape
    num_experts, hidden, inter = w2.shape
    num_pairs = num_tokens * top_k
    quant = _QUANT[spec.quant]
    on_gpu = x.is_cuda
    w8a8 = quant == 1
    cfg = launch_config(num_pairs, num_experts, on_gpu, w8a8)
    if w8a8 and (cfg.block_k != 128 or cfg.block_n1 != 128):
        raise ValueError(f"W8A8 needs 128-deep K steps and 128-wide gemm1 tiles (one scale "
                         f"group), got {cfg}")
    a = _activations(x, x_scale, w8a8)
    # W8A8 with a half-precision input: quantised once per token, in the alignment's launch
    quantise = a if w8a8 and a.dtype != torch.float8_e4m3fn else None
    # the W8A8 intermediate is fp8 with 1x128 scales (held in float32 under the interpreter)
    mid_dtype = (torch.float8_e4m3fn if on_gpu else torch.float32) if w8a8 else a.dtype
    w1, w2 = _unit_stride(w1), _unit_stride(w2)
    flat_w = weights.reshape(-1).float().contiguous()
    with device_of(x):
        check = None if spec.ids_fault is None else (
            record(ids.device), spec.num_experts_total, spec.ids_fault.code)
        sorted_pairs, block_expert, num_blocks, x_q, x_q_scale = prepare(
            ids, spec.expert_offset, num_experts, cfg.block_m, quantise, check)
        if quantise is not None:
            a, x_scale = x_q, x_q_scale
        xs, xs_t, xs_k = (x_scale, x_scale.stride(0), x_scale.stride(1)) if w8a8 else (a, 0, 0)
        rows = sorted_pairs.numel()
        grid_m = rows // cfg.block_m
        mid = torch.empty((rows, inter), dtype=mid_dtype, device=x.device)
        mid_s = (torch.empty((rows, -(-inter // 128)), dtype=torch.float32, device=x.device)
                 if w8a8 else flat_w)
        s1, s1e, s1n, s1k = _scale_args(w1_scale, quant, flat_w)
        w1_desc, w2_desc = _weight_descriptors(w1, w2, cfg) if cfg.weights_tma else (None, None)
        grid_n1 = -(-inter // cfg.block_n1)
        fast(_moe_kernels.gemm1_kernel)[(grid_m * grid_n1,)](
            a, xs, w1, w1_desc, s1, mid, mid_s, sorted_pairs, block_expert, num_blocks, flat_w,
            num_pairs, hidden, inter, grid_m,
            a.stride(0), xs_t, xs_k, w1.stride(0), w1.stride(1), s1e, s1n, s1k, mid.stride(0),
            mid_s.stride(0),
            TOP_K=top_k, ACTIVATION=int(spec.activation), QUANT=quant,
            SCALES_ON_INPUT=bool(spec.scales_on_input), BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n1, BLOCK_K=cfg.block_k, EVEN_K=hidden % cfg.block_k == 0,
            DOT_F32=not on_gpu, GRID_N=grid_n1, GROUP_M=cfg.group_m, W_TMA=w1_desc is not None,
            num_warps=cfg.warps1, num_stages=cfg.stages1,
        )
        # one row per pair, never zero-filled: finalize skips the pairs of other ranks
        result = torch.empty((num_pairs, hidden), dtype=_partial_dtype(out), device=x.device)
        s2, s2e, s2n, s2k = _scale_args(w2_scale, quant, flat_w)
        grid_n2 = -(-hidden // cfg.block_n2)
        fast(_moe_kernels.gemm2_kernel)[(grid_m * grid_n2,)](
            mid, mid_s, w2, w2_desc, s2, result, sorted_pairs, block_expert, num_blocks, flat_w,
            num_pairs, hidden, inter, grid_m,
            mid.stride(0), mid_s.stride(0), w2.stride(0), w2.stride(1), s2e, s2n, s2k,
            result.stride(0),
            QUANT=quant, SCALES_ON_INPUT=bool(spec.scales_on_input), BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n2, BLOCK_K=cfg.block_k, EVEN_K=inter % cfg.block_k == 0,
            DOT_F32=not on_gpu, GRID_N=grid_n2, GROUP_M=cfg.group_m, W_TMA=w2_desc is not None,
            num_warps=cfg.warps2, num_stages=cfg.stages2,
        )
        if num_tokens:
            block_h = 1024 if on_gpu else 128
            fast(_moe_kernels.finalize_kernel)[(num_tokens, -(-hidden // block_h))](
                result, ids, out, num_tokens, hidden, spec.expert_offset, result.stride(0),
                out.stride(0), NUM_EXPERTS=num_experts, TOP_K=top_k, BLOCK_H=block_h,
                num_warps=4)


def _weight_descriptors(w1: torch.Tensor, w2: torch.Tensor, cfg: LaunchConfig):
    """Tensor descriptors of ``w1`` as ``[E * 2I, H]`` and ``w2`` as ``[E * H, I]`` with
    ``[block_n, block_k]`` blocks, for the copy engine (TMA) to load the weight tiles; ``(None,
    None)`` where the hardware's rules do not hold (packed weights, 16-byte aligned base and
    rows) or the GPU has no TMA (before SM 9.0). Triton's interpreter emulates them."""
    def usable(w: torch.Tensor) -> bool:
        row_bytes = w.shape[2] * w.element_size()
        return w.is_contiguous() and w.data_ptr() % 16 == 0 and row_bytes % 16 == 0

    on_gpu = w1.is_cuda
    if not (usable(w1) and usable(w2)) or (on_gpu and torch.cuda.get_device_capability(
            w1.device) < (9, 0)):
        return None, None
    from triton.tools.tensor_descriptor import TensorDescriptor

    def describe(w: torch.Tensor, block_n: int) -> "TensorDescriptor":
        rows = w.view(-1, w.shape[2])
        return TensorDescriptor(rows, list(rows.shape), list(rows.stride()), [block_n,
                                                                             cfg.block_k])

    return describe(w1, cfg.block_n1), describe(w2, cfg.block_n2)


def _partial_dtype(out: torch.Tensor) -> torch.dtype:
    """Per-pair gemm2 rows: the output's half precision dtype on the GPU (as upstream's CUTLASS
    MoE; finalize sums them in float32), float32 otherwise (and under the interpreter, whose
    bfloat16 casts truncate)."""
    if out.is_cuda and out.dtype in (torch.float16, torch.bfloat16):
        return out.dtype
    return torch.float32


def reasons(problem) -> list[Reason]:
    """FP8 experts need Triton's native fp8 conversions (SM 8.9 and newer)."""
    fp8 = dict(problem.dtypes).get("weight") == "float8_e4m3fn"
    if fp8 and problem.sm is not None and problem.sm < (8, 9):
        sm = f"{problem.sm[0]}.{problem.sm[1]}"
        return [Reason("sm", sm, ">=8.9 for float8_e4m3fn experts",
                       f"fp8 experts need SM 8.9 or newer (Triton fp8 conversions), device is "
                       f"SM {sm}")]
    return []
