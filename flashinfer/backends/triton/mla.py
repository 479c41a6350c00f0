"""Triton split-K MLA (flash-decoding over the latent cache): the ``batch_mla`` planner and its
runner.

Contract: :mod:`flashinfer.attention.mla_params`. The planner fixes the launch shape and carves
the fp32 split scratch from the start of the wrapper's workspace (allocated when there is none);
the runner launches :func:`~._mla_kernels.mla_split_kernel`, then the batch attention's merge
kernel when the keys are split, and nothing else: no host sync, no allocation, every length and
page id read from the plan's device arrays, so a CUDA graph captures it and replays it with the
values a later plan wrote into the same buffers.

Launch shape, from the plan:

* rows: the ``max_qo_len * num_heads`` (query token, head) rows of a request, in tiles of
  ``block_m`` (64 for DeepSeek's 128 heads: two tiles share each ``ckv`` tile through L2; the
  rows of small head counts in one tile of at least 16, so ``tl.dot`` runs on tensor cores);
  tiles of 64 take 64 tokens a step with 8 warps and 2 stages, smaller ones 32 with 4 warps and
  3 stages (the fastest of benchmarks/tune_mla.py's sweep at each);
* splits: enough ``(request, row tile, split)`` programs for ``PROGRAMS_PER_SM`` per SM, each
  split covering at least ``MIN_KEYS_PER_SPLIT`` tokens of the longest request (a CUDA-graph
  plan ignores the lengths: it takes the SM-filling count), at most what the workspace holds
  the scratch of.

A CUDA-graph plan's launch shape is the one its first plan fixed (the graph holds it): the
wrapper keeps the runner's config and a later plan with more rows per request than it covers is
refused there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


from ...attention.mla_params import MLA_PAGE, MLAPlan, MLAScales
from ...index_checks import record
from .batch_attention import ALIGN, reasons, split_scratch
from .launch import cdiv, device_of, fast, pow2, sm_count

#: programs per SM the split count aims for (row tiles of 32-64; of 16 rows, the memory-bound
#: small head counts: more loads in flight). benchmarks/tune_mla.py on the H200, 2026-12-02:
#: 128 heads B=64 kv 4096 page 1: 3 splits 0.555 ms, 6 splits 0.594; 16 heads: 10 splits 0.146
#: ms, 5 splits 0.169.
PROGRAMS_PER_SM = 2
SMALL_TILE_PROGRAMS_PER_SM = 4
#: fewest tokens of the longest request one split should cover.
MIN_KEYS_PER_SPLIT = 256
#: most splits (the merge holds them in one tile).
MAX_SPLITS = 32
#: largest row tile.
MAX_BLOCK_M = 64

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class MLALaunch:
    block_m: int
    row_tiles: int
    block_n: int
    num_splits: int
    num_warps: int
    num_stages: int


def launch_config(plan: MLAPlan, **forced) -> MLALaunch:
    """The launch shape for ``plan``; keyword arguments force fields (tests, tuning)."""
    rows = max(1, plan.max_qo_len) * plan.num_heads
    block_m = forced.get("block_m") or min(MAX_BLOCK_M, max(16, pow2(rows)))
    row_tiles = cdiv(rows, block_m)
    num_splits = forced.get("num_splits")
    if num_splits is None:
        programs = max(1, plan.batch_size * row_tiles)
        per_sm = PROGRAMS_PER_SM if block_m > 16 else SMALL_TILE_PROGRAMS_PER_SM
        num_splits = cdiv(per_sm * sm_count(plan.device), programs)
        if not plan.cuda_graph:
            num_splits = min(num_splits, cdiv(max(1, plan.max_kv_len), MIN_KEYS_PER_SPLIT))
        num_splits = min(num_splits, _splits_fitting(plan))
    big = block_m >= 64
    launch = MLALaunch(block_m, row_tiles, block_n=64 if big else 32,
                       num_splits=max(1, min(MAX_SPLITS, num_splits)),
                       num_warps=8 if big else 4, num_stages=2 if big else 3)
    return replace(launch, **{k: v for k, v in forced.items() if k not in ("block_m", "num_splits")})


def _scratch_parts(plan: MLAPlan, num_splits: int) -> int:
    return plan.total_qo * plan.num_heads * num_splits


def _scratch_bytes(plan: MLAPlan, num_splits: int) -> int:
    parts = _scratch_parts(plan, num_splits)
    return (cdiv(parts * plan.head_dim_ckv * 4, ALIGN) + cdiv(parts * 4, ALIGN)) * ALIGN + ALIGN


def _splits_fitting(plan: MLAPlan) -> int:
    """The most splits whose scratch fits the workspace (no workspace: any, it is allocated)."""
    ws = plan.workspace
    if ws is None:
        return MAX_SPLITS
    fits = 1
    while fits < MAX_SPLITS and _scratch_bytes(plan, fits + 1) <= ws.numel():
        fits += 1
    return fits


class MLARunner:
    """``runner(q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales)`` for one plan."""

    def __init__(self, plan: MLAPlan, launch: MLALaunch):
        self.plan = plan
        self.launch = launch
        self.part_o, self.part_lse = (
            split_scratch(plan.device, plan.workspace, _scratch_parts(plan, launch.num_splits),
                          plan.head_dim_ckv, "triton batch_mla")
            if launch.num_splits > 1 else (None, None))
        self.errors = record(plan.device)

    def __call__(self, q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales: MLAScales):
        from . import _batch_attention_kernels as merge
        from . import _mla_kernels as K

        plan, cfg = self.plan, self.launch
        if lse is not None and lse.stride() != (plan.num_heads, 1):
            raise ValueError(f"lse must be contiguous [total_qo, num_heads], got strides "
                             f"{tuple(lse.stride())}")
        for name, t in (("q_nope", q_nope), ("q_pe", q_pe), ("out", out)):
            if t.shape[-1] > 1 and t.stride(-1) != 1:
                raise ValueError(f"{name} must have a unit-stride last dim, got strides "
                                 f"{tuple(t.stride())}")
        arr = scales.ckv_scale_arr
        ckv_scale = 1.0 if scales.ckv_scale is None else scales.ckv_scale
        pe_ratio = scales.kpe_scale / ckv_scale
        single = cfg.num_splits == 1
        unused = q_nope  # a pointer argument its constexpr switches off
        with device_of(q_nope):
            fast(K.mla_split_kernel)[(plan.batch_size, cfg.row_tiles, cfg.num_splits)](
                q_nope, q_pe, ckv_cache, kpe_cache, unused if arr is None else arr,
                unused if single else self.part_o, unused if single else self.part_lse,
                out, unused if lse is None else lse, self.errors,
                plan.qo_indptr, plan.kv_indptr, plan.kv_indices, plan.kv_len,
                q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
                ckv_cache.stride(0), ckv_cache.stride(1), kpe_cache.stride(0), kpe_cache.stride(1),
                0 if arr is None else arr.stride(0), 0 if arr is None else arr.stride(1),
                out.stride(0), out.stride(1),
                plan.sm_scale * ckv_scale * _LOG2E, pe_ratio, ckv_scale,
                min(ckv_cache.shape[0], kpe_cache.shape[0]), MLA_PAGE.code,
                max(1, plan.max_qo_len) * plan.num_heads, cfg.num_splits,
                NUM_HEADS=plan.num_heads, SPLIT=not single, PAGE=plan.page_size,
                D_CKV=plan.head_dim_ckv, D_KPE=plan.head_dim_kpe,
                BLOCK_CKV=max(16, pow2(plan.head_dim_ckv)),
                BLOCK_KPE=max(16, pow2(plan.head_dim_kpe)),
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                CAUSAL=plan.causal,
                HAS_PE_RATIO=pe_ratio != 1.0, HAS_SCALE_ARR=arr is not None,
                CHECK_PAGES=True, WRITE_LSE=lse is not None, DOT_F32=not q_nope.is_cuda,
                num_warps=cfg.num_warps,
                num_stages=1 if arr is not None else cfg.num_stages,  # (fp32 scale tiles: smem)
            )
            if single:
                return out
            block = max(16, pow2(plan.head_dim_ckv))
            fast(merge.decode_merge_kernel)[(plan.total_qo, plan.num_heads)](
                self.part_o, self.part_lse, out, self.part_lse if lse is None else lse,
                self.part_lse, out.stride(0), out.stride(1), ckv_scale,
                NUM_QO_HEADS=plan.num_heads, NUM_SPLITS=cfg.num_splits,
                BLOCK_S=max(2, pow2(cfg.num_splits)), D_VO=plan.head_dim_ckv, BLOCK_DVO=block,
                HAS_SINKS=False, WRITE_LSE=lse is not None,
                num_warps=4 if block >= 128 else 2,
            )
        return out


def make_runner(plan: MLAPlan, **forced) -> MLARunner:
    """The runner for ``plan``; keyword arguments force launch fields (tests, tuning)."""
    return MLARunner(plan, launch_config(plan, **forced))


def batch_mla(plan: MLAPlan) -> MLARunner:
    return make_runner(plan)


__all__ = ["MLALaunch", "MLARunner", "batch_mla", "launch_config", "make_runner", "reasons"]
