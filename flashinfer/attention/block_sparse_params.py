"""The ``block_sparse_attention`` kernel contract: what a planned block-sparse call hands its
kernel (``decision.kernel(plan)`` returns the runner).

``runner(q, k, v, out, lse, scales)``: ``q [M, H_qo, D]``, ``k`` / ``v [N, H_kv, D]`` on the
plan's device; ``out [M, H_qo, D]`` (the planned output dtype) written in place; ``lse [M,
H_qo]`` float32 base 2, or None. A query row that sees no key outputs 0 and lse ``-inf``.
``scales``: the run's ``(scale_q, scale_k, scale_v)``, None where not given.

Block map: row block ``i`` (``R`` rows, the last one what is left of ``M``) attends to the column
blocks ``indices[indptr[i]:indptr[i+1]]`` (strictly increasing: checked by the wrapper). With
``causal``, query ``r`` of a row block of ``n_r`` rows sees the first ``n_keys - n_r + r + 1`` of
the keys its blocks select, in block order (upstream's alignment of a row block's last query with
its last key). ``mask [nnz, R, C]`` (bool, True: attend) masks inside the blocks, entry ``e``
being block ``indices[e]`` of its row.

``paged_run`` carries the runner of the paged-prefill mapping, planned by the wrapper on the
batch prefill kernel the Decision names (that planning needs the family layer, above the
backends), for the backends whose record serves the op that way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch


@dataclass
class BlockSparsePlan:
    device: torch.device
    num_rows: int  # M
    num_cols: int  # N
    block_rows: int  # R
    block_cols: int  # C
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    indptr: np.ndarray  # [ceil(M / R) + 1] int32, host
    indices: np.ndarray  # [nnz] int32, host
    mask: Optional[torch.Tensor]  # [nnz, R, C] bool on the device, or None
    causal: bool
    sm_scale: float
    logits_soft_cap: float  # 0: none
    o_dtype: torch.dtype
    paged_run: Optional[Callable] = None


__all__ = ["BlockSparsePlan"]
