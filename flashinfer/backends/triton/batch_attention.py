"""Triton split-K batch attention (flash-decoding): the ``batch_decode``, ``batch_prefill_paged``
and ``batch_prefill_ragged`` planners and their runner.

Contract: :mod:`flashinfer.attention.batch_params`. The planner fixes the launch shape and
allocates (or carves from ``plan.workspace``) the fp32 split scratch; the runner launches one
kernel (``_batch_attention_kernels.py``), or two when the keys are split (the merge), and does
nothing else: no host sync, no allocation, so it can be captured in a CUDA graph.

Launch shape, from the plan:

* query rows: the ``q_len * group`` rows of a request that share one KV head (``q_len``: decode's
  ``q_len_per_req``, prefill's longest request) form tiles of ``BLOCK_M`` (a power of two, at
  least 16 so ``tl.dot`` runs on tensor cores, at most ``MAX_BLOCK_M``);
* splits: enough ``(request, kv head, row tile, split)`` programs to give every SM
  ``PROGRAMS_PER_SM`` of them, each split covering at least ``MIN_KEYS_PER_SPLIT`` keys of the
  longest request (at most ``MAX_SPLITS``; prefill: as many as the workspace holds the scratch
  of). A CUDA-graph plan ignores the lengths (the graph is replayed with other ones): it takes
  the SM-filling count. Every launch cuts the keys each row tile can see into that many chunks
  on the device, from the ``kv_lens`` and ``qo_indptr`` buffers.

Semantics beyond the contract: a decode with ``q_len_per_req > 1`` is causal inside each request
(query ``r`` of ``L`` sees keys ``j <= kv_len - L + r``) whether or not ``plan.causal`` is set.
Prefill follows the plan (causal or not; a custom mask replaces causal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...attention.batch_params import BatchPlan, KVInput, RunScales
from ...attention.params import cached_alibi_slopes
from ...reasons import Reason
from ..shared.paged_mapping import block_sparse as block_sparse_paged  # (a record's kernel)
from .launch import cdiv, device_of, fast, pow2, sm_count

#: programs per SM the split count aims for.
PROGRAMS_PER_SM = 2
#: fewest keys of the longest request one split should cover.
MIN_KEYS_PER_SPLIT = 256
#: most splits (the merge holds them in one tile).
MAX_SPLITS = 64
#: largest query-row tile.
MAX_BLOCK_M = 64
#: byte alignment of each scratch buffer carved from the workspace.
ALIGN = 256

_LOG2E = 1.4426950408889634
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)




@dataclass(frozen=True)
class LaunchConfig:
    block_m: int
    row_tiles: int
    block_n: int
    block_dqk: int
    block_dvo: int
    num_splits: int
    num_warps: int
    num_stages: int


def launch_config(plan: BatchPlan, num_splits: int | None = None) -> LaunchConfig:
    """The launch shape for ``plan``; ``num_splits`` forces the split count (tests, tuning)."""
    group = plan.num_qo_heads // plan.num_kv_heads
    rows = _q_len(plan) * group
    block_m = min(MAX_BLOCK_M, max(16, pow2(rows)))
    row_tiles = cdiv(rows, block_m)
    block_dqk = max(16, pow2(plan.head_dim_qk))
    block_dvo = max(16, pow2(plan.head_dim_vo))
    widest = max(block_dqk, block_dvo)
    block_n = 64 if widest <= 128 else 32
    if num_splits is None:
        programs = plan.num_kv_heads * (
            plan.batch_size * row_tiles if plan.op == "batch_decode"
            else sum(cdiv(int(n) * group, block_m) for n in _qo_lens(plan)))
        num_splits = cdiv(PROGRAMS_PER_SM * sm_count(plan.device), max(1, programs))
        if not plan.cuda_graph:
            num_splits = min(num_splits, cdiv(max(1, plan.max_kv_len), MIN_KEYS_PER_SPLIT))
        if plan.op != "batch_decode":  # prefill: as many splits as the workspace holds
            num_splits = min(num_splits, _splits_fitting(plan))
    num_splits = max(1, min(MAX_SPLITS, int(num_splits)))
    return LaunchConfig(block_m, row_tiles, block_n, block_dqk, block_dvo, num_splits,
                        num_warps=4, num_stages=2 if widest > 128 else 3)


def _q_len(plan: BatchPlan) -> int:
    """Query tokens of the longest request (decode: ``q_len_per_req``)."""
    return max(1, plan.q_len_per_req if plan.op == "batch_decode" else plan.max_qo_len)


def _qo_lens(plan: BatchPlan):
    host = plan.qo_indptr_host
    return (host[1:] - host[:-1]).tolist()


def _splits_fitting(plan: BatchPlan) -> int:
    """The most splits whose scratch fits the plan's workspace (1 needs none: no workspace, or
    one too small, keeps a prefill to one split)."""
    ws = plan.workspace
    if ws is None:
        return 1
    fits = 1
    while fits < MAX_SPLITS and scratch_bytes(plan, fits + 1) + ALIGN <= ws.numel():
        fits += 1
    return fits


def scratch_bytes(plan: BatchPlan, num_splits: int) -> int:
    """Bytes of split scratch (partial outputs, then partial lse) the plan needs."""
    parts = plan.total_qo * plan.num_qo_heads * num_splits
    return _round_up(parts * plan.head_dim_vo * 4, ALIGN) + _round_up(parts * 4, ALIGN)


def workspace_bound(batch_size: int, q_len_per_req: int, num_qo_heads: int, num_kv_heads: int,
                    head_dim: int, device: torch.device) -> int:
    """The most bytes of the caller's workspace a plan of these facts takes: the split scratch
    at the split count :func:`launch_config` picks without the key-length cap (the most it
    picks), plus the alignment shift."""
    facts = BatchPlan.__new__(BatchPlan)
    for name, value in dict(op="batch_decode", batch_size=batch_size, q_len_per_req=q_len_per_req,
                            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                            head_dim_qk=head_dim, head_dim_vo=head_dim, device=device,
                            cuda_graph=True, max_kv_len=0,
                            total_qo=batch_size * q_len_per_req).items():
        object.__setattr__(facts, name, value)
    return scratch_bytes(facts, launch_config(facts).num_splits) + ALIGN


def _round_up(n: int, m: int) -> int:
    return cdiv(n, m) * m


def _scratch(plan: BatchPlan, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    return split_scratch(plan.device, plan.workspace,
                         plan.total_qo * plan.num_qo_heads * num_splits, plan.head_dim_vo,
                         f"triton {plan.op}")


def split_scratch(device: torch.device, workspace: torch.Tensor | None, parts: int, width: int,
                  what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 split scratch ``(part_o [parts * width], part_lse [parts])``: carved from the
    start of the byte buffer ``workspace`` (the same memory at every plan, which a captured
    CUDA graph needs), or allocated when there is none."""
    o_bytes = _round_up(parts * width * 4, ALIGN)
    need = o_bytes + _round_up(parts * 4, ALIGN)
    if workspace is None:
        buf = torch.empty(need, dtype=torch.uint8, device=device)
    else:
        ws = workspace
        if ws.device != device or ws.dtype != torch.uint8 or not ws.is_contiguous():
            raise ValueError(f"workspace must be a contiguous byte buffer (uint8) on "
                             f"{device}, got {ws.dtype} on {ws.device} "
                             f"(contiguous={ws.is_contiguous()})")
        ws = ws.reshape(-1)
        shift = -ws.data_ptr() % ALIGN  # start the scratch on an ALIGN-byte boundary
        if ws.numel() < shift + need:
            raise ValueError(
                f"workspace too small for the {what} split-K scratch: needs {shift + need} "
                f"bytes ({parts} partial rows x (width {width} + 1) fp32 values, "
                f"{ALIGN}-byte aligned), workspace has {ws.numel()} bytes")
        buf = ws[shift:shift + need]
    part_o = buf[:parts * width * 4].view(torch.float32)
    part_lse = buf[o_bytes:o_bytes + parts * 4].view(torch.float32)
    return part_o, part_lse


def _require_unit_stride(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit-stride last dim, got strides {tuple(t.stride())}")


class BatchAttentionRunner:
    """``runner(q, kv, out, lse, scales)`` for one :class:`BatchPlan` (see the module note)."""

    def __init__(self, plan: BatchPlan, config: LaunchConfig):
        if plan.op not in _OPS:
            raise ValueError(f"plan.op is {plan.op!r}; this planner serves {', '.join(_OPS)}")
        if plan.num_qo_heads % plan.num_kv_heads:
            raise ValueError(f"num_qo_heads={plan.num_qo_heads} is not a multiple of "
                             f"num_kv_heads={plan.num_kv_heads}")
        if plan.kv_layout not in ("NHD", "HND"):
            raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {plan.kv_layout!r}")
        self.ragged = plan.op == "batch_prefill_ragged"
        if not self.ragged and not 1 <= plan.page_size:
            raise ValueError(f"page_size must be >= 1, got {plan.page_size}")
        self.plan = plan
        self.config = config
        self.part_o, self.part_lse = (_scratch(plan, config.num_splits) if config.num_splits > 1
                                      else (None, None))
        self.group = plan.num_qo_heads // plan.num_kv_heads
        mask = plan.custom_mask
        if plan.op == "batch_decode":
            self.causal = plan.causal or plan.q_len_per_req > 1
        else:
            self.causal = plan.causal and mask is None  # a custom mask replaces causal
        # custom mask bytes (a bool tensor's storage read as uint8: no copy) and their offsets
        self.mask = None if mask is None else mask.view(torch.uint8)
        self.mask_indptr = (None if mask is None else
                            plan.mask_indptr_host.to(plan.device, torch.int64, non_blocking=True))
        self.kv_indices = plan.kv_indices if plan.kv_indices is not None else plan.kv_indptr
        # ALiBi: float32 slope per query head (upstream's), made once
        self.alibi = (cached_alibi_slopes(plan.num_qo_heads, plan.device).float().contiguous()
                      if plan.pos_encoding_mode == "ALIBI" else None)

    def __call__(self, q: torch.Tensor, kv: KVInput, out: torch.Tensor,
                 lse: torch.Tensor | None, scales: RunScales) -> None:
        from . import _batch_attention_kernels as K

        plan, cfg = self.plan, self.config
        for name, t in (("q", q), ("k", kv.k), ("v", kv.v), ("out", out)):
            _require_unit_stride(name, t)
        if lse is not None and lse.stride() != (plan.num_qo_heads, 1):
            raise ValueError(f"lse must be contiguous [total_qo, num_qo_heads], got strides "
                             f"{tuple(lse.stride())}")
        k, v = kv.k, kv.v
        if self.ragged:  # [rows, H, D] (an HND input arrives transposed): no page stride
            k_strides, v_strides = (0, k.stride(0), k.stride(1)), (0, v.stride(0), v.stride(1))
        else:  # page views: NHD [pages, page, H, D], HND [pages, H, page, D]
            tok_dim, head_dim = (1, 2) if plan.kv_layout == "NHD" else (2, 1)
            k_strides = (k.stride(0), k.stride(tok_dim), k.stride(head_dim))
            v_strides = (v.stride(0), v.stride(tok_dim), v.stride(head_dim))
        qk_scale = plan.sm_scale * scales.q_scale * scales.k_scale
        cap = plan.logits_soft_cap
        window = plan.window_left
        sinks = scales.sinks
        single = cfg.num_splits == 1
        unused = q  # a pointer argument its constexpr switches off
        with device_of(q):
            fast(K.attention_split_kernel)[(plan.batch_size, plan.num_kv_heads * cfg.row_tiles,
                                           cfg.num_splits)](
                q, k, v, unused if single else self.part_o, unused if single else self.part_lse,
                out, unused if lse is None else lse, unused if sinks is None else sinks,
                plan.qo_indptr, plan.kv_indptr, self.kv_indices, plan.kv_lens,
                unused if self.mask is None else self.mask,
                unused if self.mask is None else self.mask_indptr,
                unused if self.alibi is None else self.alibi,
                q.stride(0), q.stride(1), *k_strides, *v_strides, out.stride(0), out.stride(1),
                qk_scale * _LOG2E, cap if cap > 0 else 1.0, (cap if cap > 0 else 1.0) * _LOG2E,
                max(window, 0), scales.v_scale,
                NUM_QO_HEADS=plan.num_qo_heads, GROUP=self.group,
                ROWS=_q_len(plan) * self.group, ROW_TILES=cfg.row_tiles,
                NUM_SPLITS=cfg.num_splits, PAGE=0 if self.ragged else plan.page_size,
                D_QK=plan.head_dim_qk, D_VO=plan.head_dim_vo,
                BLOCK_DQK=cfg.block_dqk, BLOCK_DVO=cfg.block_dvo,
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                CAUSAL=self.causal, HAS_WINDOW=window >= 0, HAS_SOFT_CAP=cap > 0,
                HAS_ALIBI=self.alibi is not None, HAS_MASK=self.mask is not None,
                HAS_SINKS=sinks is not None, WRITE_LSE=lse is not None, DOT_F32=not q.is_cuda,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )
            if single:
                return
            fast(K.decode_merge_kernel)[(plan.total_qo, plan.num_qo_heads)](
                self.part_o, self.part_lse, out, self.part_lse if lse is None else lse,
                self.part_lse if sinks is None else sinks,
                out.stride(0), out.stride(1), scales.v_scale,
                NUM_QO_HEADS=plan.num_qo_heads, NUM_SPLITS=cfg.num_splits,
                BLOCK_S=max(2, pow2(cfg.num_splits)),
                D_VO=plan.head_dim_vo, BLOCK_DVO=cfg.block_dvo,
                HAS_SINKS=sinks is not None, WRITE_LSE=lse is not None,
                num_warps=4 if cfg.block_dvo >= 128 else 2,
            )


_OPS = ("batch_decode", "batch_prefill_paged", "batch_prefill_ragged")


def make_runner(plan: BatchPlan, num_splits: int | None = None) -> BatchAttentionRunner:
    """The runner for ``plan``; ``num_splits`` forces the split count (tests, tuning)."""
    return BatchAttentionRunner(plan, launch_config(plan, num_splits))


def batch_decode(plan: BatchPlan) -> BatchAttentionRunner:
    return make_runner(plan)


def batch_prefill(plan: BatchPlan) -> BatchAttentionRunner:
    """The paged and ragged prefill planner (one function: the op is in the plan)."""
    return make_runner(plan)


def reasons(problem) -> list[Reason]:
    """FP8 KV needs Triton's native fp8 conversions (SM 8.9 and newer)."""
    if "fp8_kv" in problem.features and problem.sm is not None and problem.sm < (8, 9):
        sm = f"{problem.sm[0]}.{problem.sm[1]}"
        return [Reason("sm", sm, ">=8.9 for fp8_kv",
                       f"fp8 KV needs SM 8.9 or newer (Triton fp8 conversions), device is SM {sm}")]
    return []


__all__ = ["BatchAttentionRunner", "LaunchConfig", "batch_decode", "batch_prefill",
           "block_sparse_paged", "launch_config", "make_runner", "scratch_bytes", "split_scratch"]
