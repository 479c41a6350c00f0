"""Top-k selection per row (upstream module ``flashinfer.topk``): ``top_k`` (alias ``topk``), the
sparse-attention transforms ``top_k_page_table_transform`` / ``top_k_ragged_transform``, and the
tie-break modes ``TopKTieBreak``.

One implementation, on torch's own kernels (CPU and GPU), so it dispatches nothing
(``flashinfer explain top_k`` says so): ``torch.topk`` for the default call; a stable sort of the
row when the call asks for a tie-break or for deterministic output, so equal values at the
selection boundary go to the smaller (``SMALL``, also what ``deterministic=True`` gives) or the
larger (``LARGE``) indices, the same way on every run. NaN counts as larger
than every number (torch's order). Upstream's ``FLASHINFER_TOPK_ALGO`` picks among its own
kernels and is not read here.
"""

from __future__ import annotations

import enum
import numbers
from typing import Optional

import torch

from .api_logging import flashinfer_api
from .index_checks import Check, enforce, fault

__all__ = ["TopKTieBreak", "top_k", "topk", "top_k_page_table_transform", "top_k_ragged_transform"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class TopKTieBreak(enum.IntEnum):
    """Which of equal values at the selection boundary are kept (upstream's values)."""

    NONE = 0
    SMALL = 1
    LARGE = 2


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


@flashinfer_api
def top_k(input: torch.Tensor, k: int, sorted: bool = False, deterministic: bool = False,
          tie_break: int = TopKTieBreak.NONE, dsa_graph_safe: bool = False
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest values of each row of ``input [batch, d]`` (float32 / float16 /
    bfloat16) and their indices: ``(values [batch, k]`` in input's dtype, ``indices [batch, k]``
    int64). ``sorted``: values in descending order (else any order). ``deterministic``: the same
    output on every run (a stable sort; equal values by index). ``tie_break``: a
    :class:`TopKTieBreak` value (or 0 / 1 / 2). ``dsa_graph_safe`` is accepted: every path here
    is capturable in a CUDA graph.
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() != 2:
        raise ValueError(f"input must be 2-D [batch, d], got shape {tuple(input.shape)}")
    if input.dtype not in _DTYPES:
        raise TypeError(f"input dtype {input.dtype} is not supported; allowed: float32, float16, "
                        "bfloat16")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= input.shape[1]:
        raise ValueError(f"k={k} must be in [1, d={input.shape[1]}]")
    sorted, deterministic = _flag("sorted", sorted), _flag("deterministic", deterministic)
    _flag("dsa_graph_safe", dsa_graph_safe)
    try:
        tie = TopKTieBreak(tie_break)
    except ValueError:
        raise ValueError(f"tie_break={tie_break!r} is not valid; allowed: 0 (NONE), 1 "
                         "(SMALL), 2 (LARGE)") from None
    k = int(k)
    if tie == TopKTieBreak.NONE and not deterministic:
        return torch.topk(input, k, dim=1, largest=True, sorted=sorted)
    if tie == TopKTieBreak.LARGE:  # a stable sort of the reversed row prefers larger indices
        values, order = torch.sort(input.flip(1), dim=1, descending=True, stable=True)
        return values[:, :k], (input.shape[1] - 1) - order[:, :k]
    values, order = torch.sort(input, dim=1, descending=True, stable=True)
    return values[:, :k], order[:, :k]


topk = top_k


# --------------------------------------------------------------------------------------------
# sparse-attention transforms: top-k of each row's window, then its indices mapped


def _faults(function: str) -> dict:
    return {
        "lengths": fault(function, "lengths", "a window inside its row: row_starts[i] + "
                         "lengths[i] <= max_len = {bound}, lengths[i] >= 0"),
        "row_starts": fault(function, "row_starts", "a start in [0, max_len = {bound}]"),
        "row_to_batch": fault(function, "row_to_batch", "a row of src_page_table: [0, {bound})"),
        "page_table_row_starts": fault(function, "page_table_row_starts",
                                       "page-table slots inside the row: start + pages needed "
                                       "<= {bound}"),
        "pages": fault(function, "lengths", "no more pages than src_page_table's row holds: "
                       "start + ceil(lengths[i] / page_size) <= {bound}"),
    }


_PAGE_FAULTS, _RAGGED_FAULTS = (_faults("top_k_page_table_transform"),
                                _faults("top_k_ragged_transform"))


def _rows_arg(name: str, t, rows: int, device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 \
            or t.shape[0] != rows or t.device != device:
        raise ValueError(f"{name} must be an int32 tensor of shape ({rows},) on {device}, got "
                         f"{getattr(t, 'dtype', type(t).__name__)} "
                         f"{tuple(getattr(t, 'shape', ()))}")
    return t.long()


def _window_topk(input, lengths, k: int, deterministic: bool, tie_break, row_starts, faults):
    """``(local [rows, k] int64, -1 past a short row's length; starts [rows]; lengths [rows])``:
    the top-k positions of each row's window ``input[i, rs : rs + L]`` (a row of ``L <= k``
    gives ``0 .. L-1``). Bad lengths or starts are reported (index contract) and clamped, so
    nothing outside ``input`` is read."""
    if not isinstance(input, torch.Tensor) or input.dim() != 2 or input.dtype not in _DTYPES:
        raise ValueError(f"input must be a 2-D float32 / float16 / bfloat16 tensor, got "
                         f"{getattr(input, 'dtype', type(input).__name__)} "
                         f"{tuple(getattr(input, 'shape', ()))}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    deterministic = _flag("deterministic", deterministic)
    try:
        tie = TopKTieBreak(tie_break)
    except ValueError:
        raise ValueError(f"tie_break={tie_break!r} is not valid; allowed: 0, 1, 2") from None
    rows, width, device = input.shape[0], input.shape[1], input.device
    lens = _rows_arg("lengths", lengths, rows, device)
    starts = (torch.zeros(rows, dtype=torch.long, device=device) if row_starts is None
              else _rows_arg("row_starts", row_starts, rows, device))
    enforce([Check(faults["row_starts"], (starts < 0) | (starts > width), starts, width),
             Check(faults["lengths"], (lens < 0) | (starts + lens > width), lens, width)], device)
    starts = starts.clamp(0, width)
    lens = torch.minimum(lens.clamp(min=0), width - starts)
    span = max(1, width)
    pos = torch.arange(span, device=device)
    valid = pos[None, :] < lens[:, None]
    window = input.gather(1, (starts[:, None] + pos[None, :]).clamp(max=width - 1)).float()
    if tie == TopKTieBreak.LARGE:  # stable sorts of the reversed positions prefer larger ones
        order = pos.flip(0).expand(rows, span)
    else:
        order = pos.expand(rows, span)
    by_value = window.gather(1, order).sort(dim=1, descending=True, stable=True).indices
    order = order.gather(1, by_value)
    order = order.gather(1, valid.gather(1, order).to(torch.int8).sort(
        dim=1, descending=True, stable=True).indices)  # the window's positions first
    take = min(k, span)
    local = order[:, :take]
    short = lens <= k
    local = torch.where(short[:, None], pos[None, :take], local)
    if deterministic:
        local = local.sort(dim=1).values
    local = torch.where(pos[None, :take] < lens[:, None], local, -1)
    if take < k:
        local = torch.cat([local, local.new_full((rows, k - take), -1)], 1)
    return local, starts, lens


def _store(result: torch.Tensor, out, name: str) -> torch.Tensor:
    if out is None:
        return result
    if not isinstance(out, torch.Tensor) or out.dtype != torch.int32 or out.shape != result.shape \
            or out.device != result.device:
        raise ValueError(f"{name} must be an int32 tensor of shape {tuple(result.shape)} on "
                         f"{result.device}")
    out.copy_(result)
    return out


@flashinfer_api
def top_k_page_table_transform(input: torch.Tensor, src_page_table: torch.Tensor,
                               lengths: torch.Tensor, k: int,
                               row_to_batch: Optional[torch.Tensor] = None,
                               deterministic: bool = False, tie_break: int = TopKTieBreak.NONE,
                               dsa_graph_safe: bool = False,
                               row_starts: Optional[torch.Tensor] = None,
                               page_table_row_starts: Optional[torch.Tensor] = None, *,
                               page_size: int = 1, out: Optional[torch.Tensor] = None,
                               out_raw_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Top-k of each row's scores, mapped through a page table (sparse attention's KV
    selection), as upstream: for row ``i`` (batch ``b = row_to_batch[i]`` or ``i``, window
    ``input[i, rs : rs + lengths[i]]``, ``rs = row_starts[i]`` or 0, page-table start ``ps =
    page_table_row_starts[i]`` or ``rs``), each selected position ``idx`` of the window becomes
    ``src_page_table[b, ps + idx // page_size] * page_size + idx % page_size``; a row of
    ``lengths[i] <= k`` selects ``0 .. lengths[i] - 1``; unused slots are -1.

    ``input [rows, max_len]`` float32 / float16 / bfloat16; ``src_page_table [batch, pages]``,
    ``lengths``, ``row_to_batch``, ``row_starts``, ``page_table_row_starts`` int32 on input's
    device; ``page_size`` a power of two. Returns int32 ``[rows, k]`` (written into ``out`` when
    given; ``out_raw_indices`` gets the window positions, -1 padded). The order within a row is
    unspecified unless ``deterministic`` (then ascending positions). Index values follow
    :mod:`flashinfer.index_checks` (a CPU call raises on a bad entry; a GPU call records it and
    reads nothing outside the tensors). ``dsa_graph_safe`` is accepted.
    """
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1 \
            or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two >= 1, got {page_size!r}")
    if page_size > 1 and row_starts is not None and page_table_row_starts is None:
        raise ValueError("page_size > 1 with row_starts needs page_table_row_starts (where each "
                         "row's pages start in src_page_table)")
    _flag("dsa_graph_safe", dsa_graph_safe)
    local, starts, lens = _window_topk(input, lengths, k, deterministic, tie_break, row_starts,
                                       _PAGE_FAULTS)
    table = src_page_table
    if not isinstance(table, torch.Tensor) or table.dtype != torch.int32 or table.dim() != 2 \
            or table.device != input.device:
        raise ValueError("src_page_table must be a 2-D int32 tensor on input's device")
    rows, device = input.shape[0], input.device
    batch, pages = table.shape
    b = (torch.arange(rows, device=device) if row_to_batch is None
         else _rows_arg("row_to_batch", row_to_batch, rows, device))
    ps = (starts if page_table_row_starts is None
          else _rows_arg("page_table_row_starts", page_table_row_starts, rows, device))
    need = ps + (lens + page_size - 1) // page_size
    enforce([Check(_PAGE_FAULTS["row_to_batch"], (b < 0) | (b >= batch), b, batch),
             Check(_PAGE_FAULTS["pages" if page_table_row_starts is None
                               else "page_table_row_starts"], (ps < 0) | (need > pages),
                   lens if page_table_row_starts is None else ps, pages)],
            device)
    if batch == 0 or pages == 0:
        mapped = torch.full_like(local, -1)
    else:
        b, slot = b.clamp(0, batch - 1), (ps[:, None] + local.clamp(min=0) // page_size)
        ids = table[b[:, None], slot.clamp(0, pages - 1)].long()
        mapped = torch.where(local >= 0, ids * page_size + local.clamp(min=0) % page_size, -1)
    if out_raw_indices is not None:
        _store(local.to(torch.int32), out_raw_indices, "out_raw_indices")
    return _store(mapped.to(torch.int32), out, "out")


@flashinfer_api
def top_k_ragged_transform(input: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                           k: int, deterministic: bool = False,
                           tie_break: int = TopKTieBreak.NONE, dsa_graph_safe: bool = False,
                           row_starts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Top-k of each row's window ``input[i, rs : rs + lengths[i]]`` (``rs = row_starts[i]``
    or 0), each selected position plus ``offsets[i]`` (a ragged KV layout's row offsets), as
    upstream; a row of ``lengths[i] <= k`` gives ``offsets[i] .. offsets[i] + lengths[i] - 1``;
    unused slots are -1. ``offsets``, ``lengths``, ``row_starts`` int32 ``[rows]``. Returns int32
    ``[rows, k]``; order and index checks as :func:`top_k_page_table_transform`.
    """
    _flag("dsa_graph_safe", dsa_graph_safe)
    local, _, _ = _window_topk(input, lengths, k, deterministic, tie_break, row_starts,
                               _RAGGED_FAULTS)
    shift = _rows_arg("offsets", offsets, input.shape[0], input.device)
    return torch.where(local >= 0, local + shift[:, None], -1).to(torch.int32)
