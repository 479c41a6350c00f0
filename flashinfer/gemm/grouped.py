"""Grouped and segment GEMM: ``SegmentGEMMWrapper`` (LoRA segment GEMM), ``grouped_mm_bf16``,
``grouped_mm_fp8`` (upstream module ``flashinfer.grouped_mm``) and ``group_gemm_fp8_nt_groupwise``.

Names, argument order, defaults of the tensor arguments and return conventions are upstream's
(api-spec.md §3; FlashInfer 0.7.2 ``gemm/gemm_base.py`` and ``grouped_mm/core.py``). Each call
returns ``out`` (allocated when not given, else written in place and returned; it must be
contiguous). Rows are split into segments by an offsets tensor ``indptr [segments + 1]``
(segment ``i`` is rows ``indptr[i]:indptr[i+1]``, empty segments allowed); rows outside
``[indptr[0], indptr[-1])`` come back as zeros (upstream zero-fills its output).

Index arrays (the contract of :mod:`flashinfer.index_checks`; :class:`SegmentFaults`): the
offsets (``m_indptr``, ``seg_indptr``, or ``seg_lens``, from which ``seg_indptr`` is built) must
be non-decreasing within ``[0, rows]`` (lengths non-negative with a running sum ``<= rows``),
``weight_indices`` in ``[0, weights.shape[0])``. Arrays on the CPU (and on a GPU with
``FLASHINFER_CHECK_INDICES=1``) are checked before anything runs: ``ValueError`` naming the
function, the argument as the caller passed it, the first bad entry, its value and what is
allowed. On a GPU they are not read back for the check (``torch:grouped_mm`` and ``triton`` run
without any host sync, CUDA-graph safe; the reference and the torch loops read the offsets to
loop over them, as before); every kernel reports the first bad entry into the device's error
record (raised by ``flashinfer.check_errors()``) and computes a defined result that reads and
writes nothing outside ``x`` / ``weights`` / ``out``:

* a bad offset: the segments before it are computed, and from it on nothing is: every later row
  of ``out`` is zero (the kernels use ``indptr`` up to its first bad entry, that entry and all
  later ones replaced by the last good offset, 0 when entry 0 is bad);
* a bad weight index: that segment's rows are zero.

Scales and ``alpha`` are data, not checked: a non-finite value makes the rows it multiplies
non-finite, no others.

Backends: ``backend="auto"`` (ours) lets the dispatcher choose. Upstream spellings:
``SegmentGEMMWrapper(backend="sm80" | "sm90")`` name upstream's CUTLASS kernels and mean
``torch`` here; ``group_gemm_fp8_nt_groupwise(backend="trtllm")`` and
``grouped_mm_*(backend="cudnn")`` name those backends (an error with their reasons while they
declare no kernel for the op); ``"cutile"`` and ``"cake"`` have no counterpart (ValueError).

Canonical kernel signatures (every backend registers exactly these; kernels write all of ``out``;
a ``segment_gemm`` kernel marked ``returns_output = True`` also accepts ``out=None`` and then
returns a new tensor — the op does so when the caller gave no ``out``). ``faults`` is the
:class:`SegmentFaults` of the public call: the :class:`~flashinfer.index_checks.Fault` a kernel
reports a bad offset / weight index under (the caller's function and argument names), and the
rules as device ops (:meth:`SegmentFaults.guard`) for kernels written in torch
---------------------------------------------------------------------------------------------------
* ``segment_gemm``: ``kernel(x, weights, seg_indptr, weight_indices, weight_column_major, alpha,
  out, faults) -> None``; ``x [M, K]`` fp16/bf16/fp8; ``weights [W, K, N]``, or ``[W, N, K]`` when
  ``weight_column_major``, same dtype as ``x``; ``seg_indptr [S + 1]`` int32/int64 and
  ``weight_indices`` None or int64 ``[S]`` on ``x``'s device; ``alpha`` None or an fp32
  one-element tensor; ``out [M, N]`` contiguous fp16/bf16/fp32.
  ``out[seg i] = alpha * x[seg i] @ W[weight_indices[i] if given else i]``.
* ``group_gemm_fp8_groupwise``: ``kernel(a, b, a_scale, b_scale, m_indptr, granularity, out,
  faults) -> None``; ``a [M, K]``, ``b [G, N, K]`` fp8; ``granularity = (gm, gn, gk)``; ``a_scale``
  logical ``[ceil(M/gm), ceil(K/gk)]``, ``b_scale`` logical ``[G, ceil(N/gn), ceil(K/gk)]``
  fp32, any strides (MN-major scales arrive as transposed views); ``m_indptr [G + 1]`` int32;
  ``out [M, N]`` contiguous bf16/fp16. Row ``r`` of group ``g`` (starting at ``s``) uses scale
  row ``s // gm + (r - s) // gm`` (upstream's layout; ``r // gm`` when ``s`` is a multiple of gm).

Dispatch Problem: dtypes as the roles above; shape facts ``num_groups`` and ``m`` (bucketed to
powers of two), ``n``, ``k`` (``segment_gemm`` also ``rows_per_group``, the mean segment length
``m // num_groups``, bucketed); ``segment_gemm`` layout ``row_major`` / ``column_major`` (the
weights) and feature ``weight_indices``; the fp8 op the scale features of
:mod:`flashinfer.gemm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Tuple

import torch

from .. import dispatch, index_checks
from ..backend_names import family_spelling
from ..api_logging import flashinfer_api
from ..custom_op import custom_op
from ..dispatch import Problem
from ..index_checks import Check, Fault, fault
from .checks import (
    FP8, FP8_OUT, backend_arg, cdiv, granularity_arg, no_output, out_dtype_arg, output_arg,
    scalar_scale_arg, scale_feature, tensor_arg,
)

__all__ = ["SegmentGEMMWrapper", "group_gemm_fp8_nt_groupwise", "grouped_mm_bf16",
           "grouped_mm_fp8"]

_INDEX = (torch.int32, torch.int64)
_SEGMENT_X = (torch.float16, torch.bfloat16) + FP8
_GROUPED_OUT = (torch.bfloat16, torch.float16, torch.float32)
def _resolve(backend) -> str:
    """A grouped GEMM's ``backend=``: the segment-GEMM spellings, then the GEMM ones."""
    return backend_arg(family_spelling("segment_gemm", backend))


# --------------------------------------------------------------------------------------------
# index rules


@dataclass(frozen=True)
class SegmentFaults:
    """The caller's names of the index arrays one public function hands a segment kernel, and
    their rules. ``offsets``: the fault of a bad offset (``m_indptr``, ``seg_indptr``; with
    ``lens``, the caller gave ``seg_lens`` and the kernels see ``seg_indptr = [0, cumsum]``:
    entry ``i + 1`` of it is reported as ``seg_lens[i]`` with the length as value);
    ``weight_indices``: the fault of a bad weight index (None where the function has none)."""

    offsets: Fault
    lens: bool = False
    weight_indices: Optional[Fault] = None

    def guard(self, indptr: torch.Tensor, rows: int,
              weight_indices: Optional[torch.Tensor] = None, num_weights: int = 0
              ) -> tuple[list[Check], torch.Tensor, Optional[torch.Tensor]]:
        """``(checks, offsets, weight_ok)`` with device ops only (no sync): the
        :class:`~flashinfer.index_checks.Check` list of the call; the offsets the kernels
        compute with (int64 ``[S + 1]``, non-decreasing within ``[0, rows]``: ``indptr`` up to
        its first bad entry, the rest replaced by the last good offset, 0 when entry 0 is bad);
        ``weight_ok`` bool ``[S]`` (None without ``weight_indices``). Entry ``i`` of ``indptr``
        is bad when it is below entry ``i - 1`` (below 0 for entry 0) or above ``rows``."""
        v = indptr.long()
        prev = torch.cat([v.new_zeros(1), v[:-1]])
        bad = (v < prev) | (v > rows)
        if self.lens:  # seg_indptr[0] is 0 (built here); entry i + 1 is seg_lens[i]
            checks = [Check(self.offsets, bad[1:], (v - prev)[1:], rows)]
        else:
            checks = [Check(self.offsets, bad, v, rows)]
        n = v.shape[0]
        index = torch.arange(n, device=v.device)
        first = torch.where(bad, index, n).min()
        last_good = (first - 1).clamp_min(0).reshape(1)  # index_select: no host sync
        kept = torch.where(first > 0, v.index_select(0, last_good), 0)
        offsets = torch.where(index < first, v, kept)
        weight_ok = None
        if weight_indices is not None:
            w = weight_indices.long()
            weight_ok = (w >= 0) & (w < num_weights)
            checks.append(Check(self.weight_indices, ~weight_ok, w, num_weights))
        return checks, offsets, weight_ok

    def host_check(self, indptr: torch.Tensor, rows: int,
                   weight_indices: Optional[torch.Tensor] = None, num_weights: int = 0) -> None:
        """Raise ``ValueError`` for the first bad entry (reads the arrays: a sync on a GPU)."""
        index_checks.raise_first(self.guard(indptr, rows, weight_indices, num_weights)[0])


def _offsets_rule(rows: str) -> str:
    return f"non-decreasing offsets within [0, {{bound}}] ({rows}, the rows)"


_RUN = "SegmentGEMMWrapper.run"
_WEIGHT_INDICES = fault(_RUN, "weight_indices", "a weight index in [0, {bound}) (weights.shape[0])")
#: the faults of each public function (the custom ops take the key: a str)
FAULTS = {
    "grouped_mm_bf16": SegmentFaults(fault("grouped_mm_bf16", "m_indptr",
                                           _offsets_rule("a.shape[0]"))),
    "grouped_mm_fp8": SegmentFaults(fault("grouped_mm_fp8", "m_indptr",
                                          _offsets_rule("a.shape[0]"))),
    "group_gemm_fp8_nt_groupwise": SegmentFaults(fault(
        "group_gemm_fp8_nt_groupwise", "m_indptr", _offsets_rule("a.shape[0]"))),
    "seg_indptr": SegmentFaults(fault(_RUN, "seg_indptr", _offsets_rule("x.shape[0]")),
                                weight_indices=_WEIGHT_INDICES),
    "seg_lens": SegmentFaults(fault(_RUN, "seg_lens",
                                    "non-negative lengths whose running sum stays within "
                                    "{bound} (x.shape[0], the rows)"),
                              lens=True, weight_indices=_WEIGHT_INDICES),
}


def _check_unlaunched(caller: str, rows: int, indptr, weight_indices, num_weights: int) -> None:
    """The index check of a call that launches no kernel (the ops and kernels check otherwise):
    on the host when wanted (CPU arrays, ``FLASHINFER_CHECK_INDICES=1``), else merged into the
    device's error record with device ops (no sync); skipped while compiling."""
    if torch.compiler.is_compiling():
        return
    faults = FAULTS[caller]
    if index_checks.host_check_wanted(indptr.device):
        faults.host_check(indptr, rows, weight_indices, num_weights)
    else:
        for check in faults.guard(indptr, rows, weight_indices, num_weights)[0]:
            index_checks.report_device(check)


def _offsets(name: str, t, length: int, device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INDEX:
        raise ValueError(f"{name} has unsupported dtype {t.dtype}; allowed: int32, int64")
    if t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"{name} must have shape ({length},), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the input is on {device}")
    return t


# --------------------------------------------------------------------------------------------
# custom ops (dispatch + kernel call; opaque to torch.compile)


def _segment_kernel(x, weights, seg_indptr, weight_indices, weight_column_major, out_dtype, n,
                    backend):
    problem = Problem.make(
        "segment_gemm", x.device,
        dtypes={"x": x.dtype, "weights": weights.dtype, "out": out_dtype},
        shape={"num_groups": dispatch.length_bucket(seg_indptr.shape[0] - 1),
               "m": dispatch.length_bucket(x.shape[0]), "n": n, "k": x.shape[1],
               "rows_per_group": dispatch.length_bucket(
                   max(1, x.shape[0] // max(1, seg_indptr.shape[0] - 1)))},
        features=("weight_indices",) if weight_indices is not None else (),
        layout="column_major" if weight_column_major else "row_major")
    return dispatch.decide(problem, backend).kernel


def _segment_faults(caller: str, x, weights, seg_indptr, weight_indices) -> SegmentFaults:
    """The call's faults, after the host check when wanted (inside the ops: real tensors)."""
    faults = FAULTS[caller]
    if index_checks.host_check_wanted(x.device):
        faults.host_check(seg_indptr, x.shape[0], weight_indices, weights.shape[0])
    return faults


@custom_op("segment_gemm", mutates_args=("out",), fake=no_output)
def _segment_gemm_op(out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor,
                     seg_indptr: torch.Tensor, weight_indices: Optional[torch.Tensor],
                     weight_column_major: bool, alpha: Optional[torch.Tensor], caller: str,
                     backend: str) -> None:
    faults = _segment_faults(caller, x, weights, seg_indptr, weight_indices)
    kernel = _segment_kernel(x, weights, seg_indptr, weight_indices, weight_column_major,
                             out.dtype, out.shape[1], backend)
    kernel(x, weights, seg_indptr, weight_indices, weight_column_major, alpha, out, faults)


def _new_output(x, weights, seg_indptr, weight_indices, weight_column_major, alpha, out_dtype, n,
                caller, backend):
    """Fake impl of the op below: a fresh ``[M, n]`` output."""
    return x.new_empty((x.shape[0], n), dtype=out_dtype)


@custom_op("segment_gemm_new", fake=_new_output)
def _segment_gemm_new_op(x: torch.Tensor, weights: torch.Tensor, seg_indptr: torch.Tensor,
                         weight_indices: Optional[torch.Tensor], weight_column_major: bool,
                         alpha: Optional[torch.Tensor], out_dtype: torch.dtype, n: int,
                         caller: str, backend: str) -> torch.Tensor:
    """``segment_gemm`` into a new output (the caller gave none): a kernel marked
    ``returns_output`` hands back its own result (``out=None``), saving the copy a library
    GEMM without ``out=`` would need; any other kernel writes a fresh tensor."""
    faults = _segment_faults(caller, x, weights, seg_indptr, weight_indices)
    kernel = _segment_kernel(x, weights, seg_indptr, weight_indices, weight_column_major,
                             out_dtype, n, backend)
    if getattr(kernel, "returns_output", False):
        return kernel(x, weights, seg_indptr, weight_indices, weight_column_major, alpha, None,
                      faults)
    out = torch.empty((x.shape[0], n), dtype=out_dtype, device=x.device)
    kernel(x, weights, seg_indptr, weight_indices, weight_column_major, alpha, out, faults)
    return out


@custom_op("group_gemm_fp8_groupwise", mutates_args=("out",), fake=no_output)
def _group_gemm_fp8_op(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       a_scale: torch.Tensor, b_scale: torch.Tensor, m_indptr: torch.Tensor,
                       gm: int, gn: int, gk: int, backend: str) -> None:
    faults = FAULTS["group_gemm_fp8_nt_groupwise"]
    if index_checks.host_check_wanted(a.device):
        faults.host_check(m_indptr, a.shape[0])
    k = a.shape[1]
    problem = Problem.make(
        "group_gemm_fp8_groupwise", a.device,
        dtypes={"a": a.dtype, "b": b.dtype, "out": out.dtype},
        shape={"num_groups": dispatch.length_bucket(b.shape[0]),
               "m": dispatch.length_bucket(a.shape[0]), "n": b.shape[1], "k": k},
        features=(scale_feature((gm, gn, gk), k),))
    dispatch.decide(problem, backend).kernel(a, b, a_scale, b_scale, m_indptr, (gm, gn, gk),
                                             out, faults)


def _segment_gemm(out, x, weights, indptr, weight_indices, column_major, alpha, backend,
                  caller: str, *, n: int = 0, dtype: Optional[torch.dtype] = None):
    """Into ``out``, or (``out`` None) into a new ``[M, n]`` tensor of ``dtype``. ``caller``: the
    key of the call's :data:`FAULTS`."""
    if x.shape[0] == 0 or n == 0 or indptr.shape[0] == 1:  # nothing to compute
        _check_unlaunched(caller, x.shape[0], indptr, weight_indices, weights.shape[0])
        if out is None:
            return torch.zeros((x.shape[0], n), dtype=dtype, device=x.device)
        return out.zero_()
    if out is None:
        return _segment_gemm_new_op(x, weights, indptr, weight_indices, column_major, alpha,
                                    dtype, n, caller, backend)
    _segment_gemm_op(out, x, weights, indptr, weight_indices, column_major, alpha, caller,
                     backend)
    return out


# --------------------------------------------------------------------------------------------
# public API


class SegmentGEMMWrapper:
    """Segment GEMM (LoRA): ``y[seg i] = x[seg i] @ W[weight_indices[i] or i]``.

    ``float_workspace_buffer`` is kept (upstream's CUTLASS kernels use it; the kernels here need
    none). ``backend``: ``"auto"``, upstream's ``"sm80"`` / ``"sm90"`` (both mean ``torch``
    here), or any backend name of this library (``"torch"``, ``"torch:segment_loop"``,
    ``"reference"``).
    """

    @flashinfer_api
    def __init__(self, float_workspace_buffer: torch.Tensor, backend: str = "auto") -> None:
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError(f"float_workspace_buffer must be a torch.Tensor, "
                            f"got {type(float_workspace_buffer).__name__}")
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str, got {type(backend).__name__}")
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer: Optional[torch.Tensor] = None
        self.backend = backend
        self._dispatch_backend = _resolve(backend)

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffer: torch.Tensor) -> None:
        """Replace the workspace buffers (kept for upstream compatibility)."""
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = int_workspace_buffer

    @flashinfer_api
    def run(self, x: torch.Tensor, weights: torch.Tensor, batch_size: int,
            weight_column_major: bool, out: Optional[torch.Tensor] = None,
            seg_lens: Optional[torch.Tensor] = None, seg_indptr: Optional[torch.Tensor] = None,
            weight_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x [rows, d_in]`` fp16/bf16/fp8; ``weights [num_weights, d_in, d_out]``, or
        ``[num_weights, d_out, d_in]`` when ``weight_column_major``, same dtype as ``x``;
        ``batch_size`` segments given by ``seg_indptr [batch_size + 1]`` or, when it is None,
        ``seg_lens [batch_size]`` (int32/int64; ``seg_indptr`` wins when both are given);
        ``weight_indices`` optional int ``[batch_size]`` picks each segment's weight (default:
        segment i uses weight i). Output ``[rows, d_out]`` in ``x``'s dtype (bf16 for fp8
        ``x``; a given fp8-call ``out`` may be fp16). Returns ``out``.
        """
        tensor_arg("x", x, 2, _SEGMENT_X)
        tensor_arg("weights", weights, 3, (x.dtype,), x.device)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size must be a non-negative int, got {batch_size!r}")
        if not isinstance(weight_column_major, bool):
            raise TypeError(f"weight_column_major must be a bool, "
                            f"got {type(weight_column_major).__name__}")
        d_in, d_out = weights.shape[1:] if not weight_column_major else weights.shape[:0:-1]
        if d_in != x.shape[1]:
            layout = "[num_weights, d_out, d_in]" if weight_column_major else \
                "[num_weights, d_in, d_out]"
            raise ValueError(f"weights must be {layout} with d_in = x.shape[1] = {x.shape[1]} "
                             f"(weight_column_major={weight_column_major}), got weights.shape "
                             f"{tuple(weights.shape)}")
        if seg_indptr is None and seg_lens is None:
            raise ValueError("either seg_lens or seg_indptr must be given")
        if weight_indices is not None:
            _offsets("weight_indices", weight_indices, batch_size, x.device)
        caller = "seg_indptr"
        if seg_indptr is None:
            caller = "seg_lens"
            lens = _offsets("seg_lens", seg_lens, batch_size, getattr(seg_lens, "device", None))
            lens = lens.to(dtype=torch.int64)
            seg_indptr = torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)])
            if (seg_indptr.device != x.device and not torch.compiler.is_compiling()
                    and index_checks.host_check_wanted(seg_indptr.device)):
                # host lengths for a GPU x (any device, as upstream): checked here, no sync
                FAULTS[caller].host_check(seg_indptr, x.shape[0])
            seg_indptr = seg_indptr.to(x.device)
        else:
            _offsets("seg_indptr", seg_indptr, batch_size + 1, x.device)
        if x.dtype in FP8:
            dtype = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16
            dtype = out_dtype_arg("out.dtype", dtype, FP8_OUT)
        else:
            dtype = x.dtype
        if out is not None:
            out = output_arg(out, (x.shape[0], d_out), dtype, x.device)
        return _segment_gemm(out, x, weights, seg_indptr, weight_indices, weight_column_major,
                             None, self._dispatch_backend, caller, n=d_out, dtype=dtype)

    forward = run


def _grouped_inputs(a, b, m_indptr, dtypes) -> None:
    tensor_arg("a", a, 2, dtypes)
    tensor_arg("b", b, 3, dtypes, a.device)
    if b.shape[2] != a.shape[1]:
        raise ValueError(f"b must be [num_experts, n, k] with k = a.shape[1] = {a.shape[1]}, "
                         f"got b.shape {tuple(b.shape)}")
    _offsets("m_indptr", m_indptr, b.shape[0] + 1, a.device)
    if m_indptr.dtype != torch.int32:
        raise ValueError(f"m_indptr has unsupported dtype {m_indptr.dtype}; allowed: int32")


def _grouped_out(out, a, b, out_dtype) -> tuple[Optional[torch.Tensor], torch.dtype]:
    """The caller's ``out`` checked (None stays None: the op makes it) and the output dtype."""
    if isinstance(out, torch.Tensor):
        out_dtype = out.dtype
    dtype = out_dtype_arg("out_dtype", out_dtype, _GROUPED_OUT)
    if out is not None:
        out = output_arg(out, (a.shape[0], b.shape[1]), dtype, a.device)
    return out, dtype


@flashinfer_api
def grouped_mm_bf16(a: torch.Tensor, b: torch.Tensor, m_indptr: torch.Tensor,
                    out: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.bfloat16,
                    *, backend: str = "auto", tactic: int = -1) -> torch.Tensor:
    """MoE grouped GEMM ``out[m_indptr[e]:m_indptr[e+1]] = a[...] @ b[e].T``: ``a [cum_m, k]``,
    ``b [num_experts, n, k]`` bf16, ``m_indptr [num_experts + 1]`` int32; output bf16 (default),
    fp16 or fp32 (``out``'s dtype wins). Returns ``out [cum_m, n]``. ``tactic`` is ignored.
    """
    _grouped_inputs(a, b, m_indptr, (torch.bfloat16,))
    out, dtype = _grouped_out(out, a, b, out_dtype)
    return _segment_gemm(out, a, b, m_indptr, None, True, None, _resolve(backend),
                         "grouped_mm_bf16", n=b.shape[1], dtype=dtype)


@flashinfer_api
def grouped_mm_fp8(a: torch.Tensor, b: torch.Tensor, m_indptr: torch.Tensor,
                   alpha: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
                   out_dtype: torch.dtype = torch.bfloat16, *, backend: str = "auto",
                   tactic: int = -1) -> torch.Tensor:
    """fp8 :func:`grouped_mm_bf16`: ``a``, ``b`` float8_e4m3fn / e5m2 (the same dtype),
    ``out = alpha * a @ b[e].T`` per expert; ``alpha`` None (1.0) or an fp32 one-element
    tensor. Output bf16 (default), fp16 or fp32. Returns ``out [cum_m, n]``.
    """
    _grouped_inputs(a, b, m_indptr, FP8)
    if b.dtype != a.dtype:
        raise ValueError(f"b has dtype {b.dtype} but a has {a.dtype}; they must match")
    if alpha is not None:
        scalar_scale_arg("alpha", alpha, a.device)
    out, dtype = _grouped_out(out, a, b, out_dtype)
    return _segment_gemm(out, a, b, m_indptr, None, True, alpha, _resolve(backend),
                         "grouped_mm_fp8", n=b.shape[1], dtype=dtype)


def _group_scale(name: str, t, groups: Optional[int], rows: int, blocks_k: int, mode: str,
                 device) -> torch.Tensor:
    """Check a grouped fp8 scale; return its K-major view (``[(G,) rows, blocks_k]``)."""
    lead = () if groups is None else (groups,)
    expected = lead + ((blocks_k, rows) if mode == "MN" else (rows, blocks_k))
    tensor_arg(name, t, len(expected), (torch.float32,), device)
    if tuple(t.shape) != expected:
        raise ValueError(f"{name} must have shape {expected} (scale_major_mode={mode!r}), "
                         f"got {tuple(t.shape)}")
    return t.transpose(-1, -2) if mode == "MN" else t


@flashinfer_api
def group_gemm_fp8_nt_groupwise(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                                b_scale: torch.Tensor, m_indptr: torch.Tensor,
                                scale_granularity_mnk: Tuple[int, int, int] = (1, 128, 128),
                                scale_major_mode: Literal["MN", "K"] = "MN", mma_sm: int = 1,
                                out: Optional[torch.Tensor] = None,
                                out_dtype: Optional[torch.dtype] = None,
                                backend: str = "auto",
                                segment_alignment: int = 1) -> torch.Tensor:
    """Grouped fp8 GEMM with block scales: ``out[seg g] = dequant(a[seg g]) @ dequant(b[g]).T``.

    ``a [cum_m, k]``, ``b [G, n, k]`` float8_e4m3fn / e5m2; ``m_indptr [G + 1]`` int32 (upstream
    asks for multiples of 4; any offsets work here). With ``scale_granularity_mnk = (gm, gn,
    gk)`` the fp32 scales are ``a_scale [ceil(k/gk), ceil(cum_m/gm)]`` and ``b_scale [G,
    ceil(k/gk), ceil(n/gn)]`` for ``scale_major_mode="MN"`` (default), ``[ceil(cum_m/gm),
    ceil(k/gk)]`` and ``[G, ceil(n/gn), ceil(k/gk)]`` for ``"K"``. Output bf16 (default) or
    fp16; ``out``'s dtype must equal ``out_dtype`` when both are given. Returns ``out [cum_m,
    n]``. ``mma_sm`` (1 or 2) and ``segment_alignment`` (>= 1) are checked and ignored.
    """
    _grouped_inputs(a, b, m_indptr, FP8)
    if scale_major_mode not in ("MN", "K"):
        raise ValueError(f"scale_major_mode must be 'MN' or 'K', got {scale_major_mode!r}")
    if mma_sm not in (1, 2):
        raise ValueError(f"mma_sm must be 1 or 2, got {mma_sm!r}")
    if isinstance(segment_alignment, bool) or not isinstance(segment_alignment, int) \
            or segment_alignment < 1:
        raise ValueError(f"segment_alignment must be an int >= 1, got {segment_alignment!r}")
    gm, gn, gk = granularity_arg(scale_granularity_mnk)
    (m, k), (groups, n) = a.shape, b.shape[:2]
    a_scale = _group_scale("a_scale", a_scale, None, cdiv(m, gm), cdiv(k, gk),
                           scale_major_mode, a.device)
    b_scale = _group_scale("b_scale", b_scale, groups, cdiv(n, gn), cdiv(k, gk),
                           scale_major_mode, a.device)
    backend = _resolve(backend)
    if isinstance(out, torch.Tensor):
        if out_dtype is not None and out.dtype != out_dtype:
            raise ValueError(f"out dtype mismatch: out.dtype = {out.dtype}, "
                             f"out_dtype = {out_dtype}")
        out_dtype = out.dtype
    dtype = out_dtype_arg("out_dtype", out_dtype or torch.bfloat16, FP8_OUT)
    out = output_arg(out, (m, n), dtype, a.device)
    if out.numel():
        _group_gemm_fp8_op(out, a, b, a_scale, b_scale, m_indptr, gm, gn, gk, backend)
    else:
        _check_unlaunched("group_gemm_fp8_nt_groupwise", m, m_indptr, None, 0)
    return out
