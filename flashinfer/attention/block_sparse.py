"""Block-sparse attention (upstream's ``flashinfer.sparse``): ``BlockSparseAttentionWrapper``
(one BSR block map of ``R x C`` blocks shared by every head) and
``VariableBlockSparseAttentionWrapper`` (one map per KV head, blocks of varying sizes).

``BlockSparseAttentionWrapper`` decides op ``block_sparse_attention`` (``wrapper.decision``):
``torch:flex`` runs flex_attention over a BlockMask of the map (backends/torch/flex.py); the
other records are the paged-prefill mapping below, planned on that record's batch prefill kernel
(``wrapper.prefill_decision``; when that kernel refuses the plan, the next usable record). The
variable form is always the mapping. The mapping is a paged batch prefill in disguise, planned
through :class:`~flashinfer.attention.batch_prefill.BatchPrefillWithPagedKVCacheWrapper`:

* BSR: row block ``i`` (``R`` query rows, the last one the remainder of ``M``) is a request whose
  pages are its column blocks, ``indices[indptr[i]:indptr[i+1]]``: ``k`` / ``v [N, H_kv, D]``
  viewed as pages of ``gcd(C, 64)`` tokens (no copy; a block is ``C / page`` of them). A per-block ``mask [nnz, R, C]`` becomes
  the request's custom mask (:func:`convert_bsr_mask_layout`'s layout); ``causal`` aligns each
  row block's last query with its last gathered key, as upstream's kernels do (for the usual
  causal pattern, a row block that ends with its diagonal block, that is global causality).
* Variable: KV head ``h``'s row block ``i`` is a request of ``block_row_sz[h, i]`` rows whose
  keys are the tokens of its selected column blocks, as pages of one token; the query heads of
  that KV head are the request's heads (q / out are re-laid once per run from HND).

Index arrays are checked in ``plan`` on the host: ``indptr`` monotone and of length
``ceil(M / R) + 1``, each row's column blocks strictly increasing in ``[0, N / C)`` (a repeated
block would count its keys twice). A row block with no column block outputs 0 (lse ``-inf``).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from .. import dispatch
from ..api_logging import flashinfer_api
from ..dispatch import Problem
from ..shape_buckets import length_bucket
from .batch_checks import check_indptr, host_index_arrays, plan_dtypes, positive_int
from .batch_prefill import BatchPrefillWithPagedKVCacheWrapper
from .block_sparse_params import BlockSparsePlan

#: the largest page the paged prefill kernels take (a wider block is several pages)
MAX_PAGE = 64
#: the variant of a mapping record that packs each KV head's query heads into rows: the batch
#: prefill then runs one head per KV head over ``g`` times the rows (``R * g`` a request), which
#: fills a kernel's row tile where ``R`` alone would leave it half empty (cuDNN's, with blocks of
#: 64 and GQA). Rows of one query share its position, so no causal mask or custom mask then.
_PACKED = ":packed_gqa"

def convert_bsr_mask_layout(mask: torch.Tensor, indptr: torch.Tensor) -> torch.Tensor:
    """A BSR block mask ``[nnz, R, C]`` as the flat ``[nnz * R * C]`` custom mask of the row
    blocks taken as requests: row block ``i``'s ``R x (n_i * C)`` rows one after another."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 3:
        raise ValueError(f"mask must be a [nnz, R, C] tensor, got "
                         f"{tuple(getattr(mask, 'shape', ())) or type(mask).__name__}")
    (ind,) = host_index_arrays(("indptr", indptr))
    check_indptr("indptr", ind)
    nnz, r, c = mask.shape
    if int(ind[-1]) != nnz:
        raise ValueError(f"mask holds {nnz} blocks, indptr[-1] = {int(ind[-1])}")
    return mask[_bsr_mask_order(ind.numpy(), r, c, r * (len(ind) - 1), mask.device)].reshape(-1) \
        if nnz else mask.reshape(-1)


def _bsr_mask_order(ind: np.ndarray, r: int, c: int, m: int, device) -> tuple:
    """Index tensors ``(entry, row, col)`` that read a ``[nnz, R, C]`` mask in the flat layout
    of the row blocks as requests (the rows of a last partial block past ``m`` left out)."""
    counts = ind[1:] - ind[:-1]
    rows = np.minimum(r, m - r * np.arange(len(counts)))
    # per request: rows x (its blocks x C), row-major; entry = first block + column // C
    sizes = rows * counts * c
    flat = np.arange(int(sizes.sum()))
    req = np.repeat(np.arange(len(counts)), sizes)
    local = flat - np.repeat(np.cumsum(sizes) - sizes, sizes)
    width = (counts * c)[req]
    row, col = local // width, local % width
    entry = ind[:-1][req] + col // c
    return tuple(torch.from_numpy(a.astype(np.int64)).to(device) for a in (entry, row, col % c))


def _check_block_indices(ind: np.ndarray, idx: np.ndarray, num_col_blocks: int) -> None:
    """Each row's column blocks strictly increasing, in ``[0, num_col_blocks)``."""
    bad = np.flatnonzero((idx < 0) | (idx >= num_col_blocks))
    if bad.size:
        e = int(bad[0])
        raise ValueError(f"indices[{e}] = {int(idx[e])} is outside [0, N / C = {num_col_blocks})")
    if idx.size > 1:
        same_row = np.ones(idx.size - 1, dtype=bool)
        starts = ind[1:-1]
        starts = starts[(starts > 0) & (starts < idx.size)]
        same_row[starts - 1] = False
        bad = np.flatnonzero(same_row & (idx[1:] <= idx[:-1]))
        if bad.size:
            e = int(bad[0]) + 1
            row = int(np.searchsorted(ind, e, side="right")) - 1
            raise ValueError(f"the column blocks of row block {row} must be strictly increasing "
                             f"(sorted, no repeats): indices[{e - 1}] = {int(idx[e - 1])}, "
                             f"indices[{e}] = {int(idx[e])}")


def _deliver(o: torch.Tensor, s: torch.Tensor, out, lse, return_lse: bool):
    """A run's result ``o`` / ``s`` (re-laid from the batch prefill's), copied into the given
    ``out`` / ``lse`` (checked by the caller) where there are some."""
    if out is not None:
        out.copy_(o)
        o = out
    if lse is not None:
        lse.copy_(s)
        s = lse
    return (o, s) if return_lse else o


def _names_a_record(backend: str) -> bool:
    """Whether ``backend`` names a ``block_sparse_attention`` record (``"cudnn"``,
    ``"reference:packed_gqa"``): its refusal stands (the batch prefill must not run it)."""
    from ..capability_db import database

    return any(backend in (r.backend, f"{r.backend}:{r.variant}")
               for r in database().for_op("block_sparse_attention"))


class _OnBatchPrefill:
    """What both wrappers share: the batch prefill wrappers they plan (one per kernel asked for;
    ``backend``: ``"auto"``, a backend name or an upstream spelling)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, backend: str = "auto") -> None:
        self._ws = float_workspace_buffer
        self._backend = backend
        self._prefills: dict[str, BatchPrefillWithPagedKVCacheWrapper] = {}
        self._prefill = None  # the planned one
        self._group = 1  # query heads per row of the planned batch prefill (see _PACKED)
        self._flex = None
        self.block_decision = None
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError(f"float_workspace_buffer must be a torch.Tensor, got "
                            f"{type(float_workspace_buffer).__name__}")
        self.device = float_workspace_buffer.device
        self._shape = None

    def _prefill_for(self, backend: str) -> BatchPrefillWithPagedKVCacheWrapper:
        w = self._prefills.get(backend)
        if w is None:
            w = self._prefills[backend] = BatchPrefillWithPagedKVCacheWrapper(
                self._ws, "NHD", backend=backend)
        return w

    @property
    def prefill_decision(self):
        """The Decision of the planned batch prefill (None when flex runs)."""
        return getattr(self._prefill, "decision", None) if self._prefill is not None else None

    @property
    def decision(self):
        """The Decision of the planned batch prefill (the kernel that runs)."""
        return self.prefill_decision

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffer: torch.Tensor) -> None:
        self._ws = float_workspace_buffer
        for w in self._prefills.values():
            w.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def end_forward(self) -> None:
        """Upstream no-op."""


class BlockSparseAttentionWrapper(_OnBatchPrefill):
    """Attention of ``q [M, H_qo, D]`` over ``k`` / ``v [N, H_kv, D]`` restricted to the BSR
    block map (``R x C`` blocks), every head sharing it."""

    @property
    def decision(self):
        """The ``block_sparse_attention`` Decision (None for an upstream spelling only the batch
        prefill takes, e.g. ``"fa2"``: then :attr:`prefill_decision`)."""
        return self.block_decision or self.prefill_decision

    @flashinfer_api
    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, M: int, N: int, R: int, C: int,
             num_qo_heads: int, num_kv_heads: int, head_dim: int,
             mask: Optional[torch.Tensor] = None, packed_mask: Optional[torch.Tensor] = None,
             causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, logits_soft_cap: Optional[float] = None,
             sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type="float16", kv_data_type=None,
             o_data_type="float16", non_blocking: bool = True,
             block_mask: Optional[torch.Tensor] = None) -> None:
        """``indptr [ceil(M/R) + 1]`` / ``indices [nnz]`` int32 (host or device): row block
        ``i`` sees column blocks ``indices[indptr[i]:indptr[i+1]]``; ``N`` a multiple of ``C``.
        ``mask [nnz, R, C]`` bool (True: attend) or ``packed_mask`` (its
        :func:`convert_bsr_mask_layout` layout, packed little-endian per row block) masks
        inside the blocks. ``o_data_type`` defaults to float16 whatever q's dtype, as upstream's
        does. ``block_mask`` (upstream's SM 10.x / 12.x VSA backends) is refused."""
        if block_mask is not None:
            raise NotImplementedError("block_mask (upstream's VSA backends for SM 10.x / 12.x) is "
                                      "not supported: give the BSR indptr / indices")
        M, N, R, C = (positive_int(n, v) for n, v in (("M", M), ("N", N), ("R", R), ("C", C)))
        num_qo_heads = positive_int("num_qo_heads", num_qo_heads)
        num_kv_heads = positive_int("num_kv_heads", num_kv_heads)
        head_dim = positive_int("head_dim", head_dim)
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
                             f"({num_kv_heads})")
        if N % C:
            raise ValueError(f"N ({N}) must be a multiple of the block width C ({C})")
        num_row_blocks = -(-M // R)
        ind, idx = host_index_arrays(("indptr", indptr), ("indices", indices))
        check_indptr("indptr", ind, num_row_blocks)
        nnz = int(ind[-1])
        if idx.shape[0] < nnz:
            raise ValueError(f"indices must hold indptr[-1] = {nnz} column block ids, got "
                             f"{idx.shape[0]}")
        ind_np, idx_np = ind.numpy(), idx.numpy()[:nnz]
        _check_block_indices(ind_np, idx_np, N // C)
        custom = None
        if mask is not None:
            if packed_mask is not None:
                raise ValueError("give mask or packed_mask, not both")
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool \
                    or tuple(mask.shape) != (nnz, R, C):
                raise ValueError(f"mask must be a bool tensor [nnz, R, C] = {[nnz, R, C]}, got "
                                 f"{getattr(mask, 'dtype', type(mask).__name__)} "
                                 f"{tuple(getattr(mask, 'shape', ()))}")
            custom = mask[_bsr_mask_order(ind_np, R, C, M, mask.device)] if nnz else \
                torch.zeros(0, dtype=torch.bool)
        q_dtype, kv_dtype, o_dtype, _ = plan_dtypes(q_data_type, kv_data_type, o_data_type)
        features = {"o_dtype_differs"} if o_dtype != q_dtype else set()
        for name, on in (("causal", causal), ("gqa", num_qo_heads != num_kv_heads),
                         ("soft_cap", bool(logits_soft_cap)), ("lse", True),
                         ("rope_llama", pos_encoding_mode == "ROPE_LLAMA"),
                         ("custom_mask", mask is not None),
                         ("packed_mask", packed_mask is not None),
                         ("fp8_kv", kv_dtype.itemsize == 1)):
            if on:
                features.add(name)
        dt = lambda d: str(d).removeprefix("torch.")  # noqa: E731
        problem = Problem.make(
            "block_sparse_attention", self.device,
            dtypes={"q": dt(q_dtype), "kv": dt(kv_dtype), "o": dt(o_dtype)},
            shape={"num_qo_heads": num_qo_heads, "num_kv_heads": num_kv_heads,
                   "head_dim": head_dim, "block_rows": R, "block_cols": C,
                   "num_rows": length_bucket(M), "num_cols": length_bucket(N)},
            features=features)
        try:
            self.block_decision = dispatch.decide(problem, self._backend)
            order = [n for n in self.block_decision.order if n != self.block_decision.name]
            order = [self.block_decision.name] + order
        except dispatch.NoBackendError:
            if self._backend in (None, "auto") or _names_a_record(self._backend):
                raise
            # an upstream spelling only the batch prefill knows (e.g. "fa2"): the mapping on it
            self.block_decision, order = None, [self._backend]
        self.M, self.N, self.R, self.C = M, N, R, C
        self._shape = None
        if order[0] == "torch:flex":
            self._prefill = None
            plan = BlockSparsePlan(
                device=self.device, num_rows=M, num_cols=N, block_rows=R, block_cols=C,
                num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                indptr=ind_np.astype(np.int32), indices=idx_np.astype(np.int32),
                mask=None if mask is None else mask.to(self.device, torch.bool), causal=causal,
                sm_scale=head_dim ** -0.5 if sm_scale is None else float(sm_scale),
                logits_soft_cap=float(logits_soft_cap or 0.0), o_dtype=o_dtype)
            self._flex = self.block_decision.kernel(plan)
            self._shape = (M, N, None, num_qo_heads, num_kv_heads, head_dim, o_dtype)
            return
        self._flex = None
        qo = np.minimum(np.arange(num_row_blocks + 1, dtype=np.int64) * R, M).astype(np.int32)
        counts = ind_np[1:] - ind_np[:-1]
        # pages of at most 64 tokens (what the paged kernels take): a column block is `split`
        # consecutive pages, in order, so the keys and the mask layout stay the same
        page = math.gcd(C, MAX_PAGE)
        split = C // page
        ids = idx[:nnz]
        if split > 1:
            ids = (ids[:, None] * split + torch.arange(split, dtype=torch.int32)).reshape(-1)
        last = np.where(counts > 0, page, 0).astype(np.int32)
        failures = []
        group = num_qo_heads // num_kv_heads
        for name in order:  # the first kernel of the Decision whose batch prefill takes it
            if name == "torch:flex":
                continue
            # packed_gqa: each KV head's query heads as rows (see _PACKED), one head per KV head
            packed = name.endswith(_PACKED)
            w = self._prefill_for(name.removesuffix(_PACKED))
            try:
                w.plan(torch.from_numpy(qo * group if packed else qo),
                       torch.from_numpy(ind_np * split), ids, torch.from_numpy(last),
                       num_kv_heads if packed else num_qo_heads, num_kv_heads, head_dim, page,
                       custom_mask=custom, packed_custom_mask=packed_mask, causal=causal,
                       pos_encoding_mode=pos_encoding_mode,
                       use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                       logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
                       rope_theta=rope_theta, q_data_type=q_data_type,
                       kv_data_type=kv_data_type, o_data_type=o_data_type,
                       non_blocking=non_blocking)
            except dispatch.NoBackendError as err:
                failures.append(f"{name}: {err}")
                continue
            self._prefill, self._group = w, (group if packed else 1)
            break
        else:
            raise dispatch.NoBackendError("no batch prefill kernel takes this block-sparse plan: "
                                          + "; ".join(failures))
        self._shape = (M, N, page, num_qo_heads, num_kv_heads, head_dim, o_dtype)

    begin_forward = plan

    @flashinfer_api
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            scale_q: Optional[torch.Tensor] = None, scale_k: Optional[torch.Tensor] = None,
            scale_v: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
            lse: Optional[torch.Tensor] = None, return_lse: bool = False, enable_pdl=None):
        """``out [M, H_qo, D]`` in the planned ``o_data_type`` (and ``lse [M, H_qo]`` float32
        base 2): ``q [M, H_qo, D]``, ``k`` / ``v [N, H_kv, D]``. ``scale_q`` / ``scale_k`` /
        ``scale_v``: fp8 dequantisation scales, as the batch prefill's ``q_scale`` /
        ``k_scale`` / ``v_scale``."""
        if self._shape is None:
            raise RuntimeError("BlockSparseAttentionWrapper.run() called before plan()")
        M, N, page, hq, hk, d, o_dtype = self._shape
        for name, t, rows, heads in (("q", q, M, hq), ("k", k, N, hk), ("v", v, N, hk)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != (rows, heads, d):
                raise ValueError(f"{name} must be [{rows}, {heads}, {d}] as planned, got "
                                 f"{tuple(getattr(t, 'shape', ())) or type(t).__name__}")
        if self._flex is not None:
            return self._run_flex(q, k, v, (scale_q, scale_k, scale_v), out, lse, return_lse,
                                  o_dtype)
        pages = (k.reshape(N // page, page, hk, d), v.reshape(N // page, page, hk, d))
        g = self._group
        if g == 1:
            return self._prefill.run(q, pages, q_scale=scale_q, k_scale=scale_k, v_scale=scale_v,
                                     out=out, lse=lse, return_lse=return_lse,
                                     enable_pdl=enable_pdl)
        # packed: q [M, H_kv * g, D] as [M * g, H_kv, D] (row r * g + j: query head h * g + j)
        self._check_given(out, lse, M, hq, d, o_dtype)
        rows = q.reshape(M, hk, g, d).transpose(1, 2).reshape(M * g, hk, d)
        o, s = self._prefill.run(rows, pages, q_scale=scale_q, k_scale=scale_k, v_scale=scale_v,
                                 return_lse=True, enable_pdl=enable_pdl)
        o = o.view(M, g, hk, d).transpose(1, 2).reshape(M, hq, d)
        s = s.view(M, g, hk).transpose(1, 2).reshape(M, hq)
        return _deliver(o, s, out, lse, return_lse)

    @staticmethod
    def _check_given(out, lse, M: int, hq: int, d: int, o_dtype) -> None:
        """A given ``out [M, H_qo, D]`` (the planned output dtype) / ``lse [M, H_qo]`` float32,
        for the paths that write them themselves (flex, the packed mapping)."""
        for name, t, shape, dtype in (("out", out, (M, hq, d), o_dtype),
                                      ("lse", lse, (M, hq), torch.float32)):
            if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != shape
                                  or t.dtype != dtype):
                raise ValueError(f"{name} must be {dtype} {list(shape)}, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} "
                                 f"{tuple(getattr(t, 'shape', ()))}")

    def _run_flex(self, q, k, v, scales, out, lse, return_lse, o_dtype):
        M, hq, d = q.shape
        self._check_given(out, lse, M, hq, d, o_dtype)
        if out is None:
            out = torch.empty(M, hq, d, dtype=o_dtype, device=q.device)
        if lse is None and return_lse:
            lse = torch.empty(M, hq, dtype=torch.float32, device=q.device)
        self._flex(q, k, v, out, lse, scales)
        return (out, lse) if return_lse else out

    def forward(self, q, k, v, scale_q=None, scale_k=None, scale_v=None,
                pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None):
        """Deprecated (upstream's signature): ``run()`` of the planned wrapper; the planned
        values stand (pass them to ``plan``)."""
        return self.run(q, k, v, scale_q, scale_k, scale_v)



class VariableBlockSparseAttentionWrapper(_OnBatchPrefill):
    """Block-sparse attention with one block map per KV head and blocks of varying sizes, on
    HND tensors: ``q [H_qo, qo_len, D]``, ``k`` / ``v [H_kv, kv_len, D]``."""

    @flashinfer_api
    def plan(self, block_mask_map: torch.Tensor, block_row_sz: torch.Tensor,
             block_col_sz: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim: int,
             causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, logits_soft_cap: Optional[float] = None,
             sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, non_blocking: bool = True,
             q_data_type="float16", kv_data_type=None) -> None:
        """``block_mask_map [H_kv, MB, NB]`` bool; ``block_row_sz [H_kv, MB]`` /
        ``block_col_sz [H_kv, NB]`` int (each KV head's rows sum to the same ``qo_len``, its
        columns to the same ``kv_len``)."""
        num_qo_heads = positive_int("num_qo_heads", num_qo_heads)
        num_kv_heads = positive_int("num_kv_heads", num_kv_heads)
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
                             f"({num_kv_heads})")
        mask = _host_tensor("block_mask_map", block_mask_map, 3, (torch.bool,))
        rows = _host_tensor("block_row_sz", block_row_sz, 2, _INT_DTYPES).to(torch.int64).numpy()
        cols = _host_tensor("block_col_sz", block_col_sz, 2, _INT_DTYPES).to(torch.int64).numpy()
        hk, mb, nb = mask.shape
        if hk != num_kv_heads or rows.shape != (hk, mb) or cols.shape != (hk, nb):
            raise ValueError(f"block_mask_map [H_kv, MB, NB], block_row_sz [H_kv, MB] and "
                             f"block_col_sz [H_kv, NB] must agree with num_kv_heads="
                             f"{num_kv_heads}: got {tuple(mask.shape)}, {rows.shape}, "
                             f"{cols.shape}")
        for name, sizes in (("block_row_sz", rows), ("block_col_sz", cols)):
            if (sizes < 0).any():
                raise ValueError(f"{name} must be >= 0, got {sizes.min()}")
            if len(set(sizes.sum(1).tolist())) > 1:
                raise ValueError(f"every KV head's {name} must sum to the same length, got "
                                 f"{sizes.sum(1).tolist()}")
        qo_len, kv_len = int(rows.sum(1)[0]), int(cols.sum(1)[0])
        # requests (h, i), h-major: rows h * qo_len + ..., tokens h * kv_len + column offsets
        head, _, col = np.nonzero(mask.numpy())
        sizes = cols[head, col]
        starts = head * kv_len + (np.cumsum(cols, 1) - cols)[head, col]
        ids = np.repeat(starts, sizes) + (np.arange(int(sizes.sum()))
                                          - np.repeat(np.cumsum(sizes) - sizes, sizes))
        per_request = mask.numpy().astype(np.int64) * cols[:, None, :]  # [H_kv, MB, NB] tokens
        kv_counts = per_request.sum(2).reshape(-1)
        kv_indptr = np.concatenate([[0], np.cumsum(kv_counts)]).astype(np.int32)
        qo_indptr = np.concatenate([[0], np.cumsum(rows.reshape(-1))]).astype(np.int32)
        last = (kv_counts > 0).astype(np.int32)
        self._prefill = self._prefill_for(self._backend)
        self._prefill.plan(
            torch.from_numpy(qo_indptr), torch.from_numpy(kv_indptr),
            torch.from_numpy(ids.astype(np.int32)), torch.from_numpy(last),
            num_qo_heads // num_kv_heads, 1, head_dim, 1, causal=causal,
            pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
            sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
            rope_theta=rope_theta, q_data_type=q_data_type, kv_data_type=kv_data_type,
            non_blocking=non_blocking)
        self._shape = (num_qo_heads, num_kv_heads, qo_len, kv_len, head_dim)

    begin_forward = plan

    @flashinfer_api
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl=None):
        """``out [H_qo, qo_len, D]`` in q's dtype (and ``lse [H_qo, qo_len]`` float32 base 2)."""
        if self._shape is None:
            raise RuntimeError("VariableBlockSparseAttentionWrapper.run() called before plan()")
        hq, hk, qo_len, kv_len, d = self._shape
        g = hq // hk
        for name, t, heads, length in (("q", q, hq, qo_len), ("k", k, hk, kv_len),
                                       ("v", v, hk, kv_len)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != (heads, length, d):
                raise ValueError(f"{name} must be HND [{heads}, {length}, {d}] as planned, got "
                                 f"{tuple(getattr(t, 'shape', ())) or type(t).__name__}")
        for name, t, shape in (("out", out, (hq, qo_len, d)), ("lse", lse, (hq, qo_len))):
            if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != shape):
                raise ValueError(f"{name} must be {list(shape)}, got "
                                 f"{tuple(getattr(t, 'shape', ())) or type(t).__name__}")
        rows = q.view(hk, g, qo_len, d).transpose(1, 2).reshape(hk * qo_len, g, d)
        pages = (k.reshape(hk * kv_len, 1, 1, d), v.reshape(hk * kv_len, 1, 1, d))
        o, s = self._prefill.run(rows, pages, return_lse=True, enable_pdl=enable_pdl)
        o = o.view(hk, qo_len, g, d).transpose(1, 2).reshape(hq, qo_len, d)
        s = s.view(hk, qo_len, g).transpose(1, 2).reshape(hq, qo_len)
        return _deliver(o, s, out, lse, return_lse)

    forward = run


_INT_DTYPES = (torch.int32, torch.int64)


def _host_tensor(name: str, t, rank: int, dtypes: tuple) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != rank or t.dtype not in dtypes:
        raise ValueError(f"{name} must be a {rank}-D tensor of {[str(d) for d in dtypes]}, got "
                         f"{getattr(t, 'dtype', type(t).__name__)} "
                         f"{tuple(getattr(t, 'shape', ()))}")
    return t.cpu()


__all__ = ["BlockSparseAttentionWrapper", "VariableBlockSparseAttentionWrapper",
           "convert_bsr_mask_layout"]
