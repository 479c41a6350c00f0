"""Top-k selection per row (upstream module ``flashinfer.topk``): ``top_k`` (alias ``topk``) and
the tie-break modes ``TopKTieBreak``.

One implementation, on torch's own kernels (CPU and GPU), so it dispatches nothing
(``flashinfer explain top_k`` says so): ``torch.topk`` for the default call; a stable sort of the
row when the call asks for a tie-break or for deterministic output, so equal values at the
selection boundary go to the smaller (``SMALLER_INDEX``, also what ``deterministic=True``
gives) or the larger (``LARGER_INDEX``) indices, the same way on every run. NaN counts as larger
than every number (torch's order). Upstream's ``FLASHINFER_TOPK_ALGO`` picks among its own
kernels and is not read here.
"""

from __future__ import annotations

import enum
import numbers

import torch

from .api_logging import flashinfer_api

__all__ = ["TopKTieBreak", "top_k", "topk"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class TopKTieBreak(enum.IntEnum):
    """Which of equal values at the selection boundary are kept (upstream's values)."""

    NONE = 0
    SMALLER_INDEX = 1
    LARGER_INDEX = 2


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
                         "(SMALLER_INDEX), 2 (LARGER_INDEX)") from None
    k = int(k)
    if tie == TopKTieBreak.NONE and not deterministic:
        return torch.topk(input, k, dim=1, largest=True, sorted=sorted)
    if tie == TopKTieBreak.LARGER_INDEX:  # a stable sort of the reversed row prefers larger indices
        values, order = torch.sort(input.flip(1), dim=1, descending=True, stable=True)
        return values[:, :k], (input.shape[1] - 1) - order[:, :k]
    values, order = torch.sort(input, dim=1, descending=True, stable=True)
    return values[:, :k], order[:, :k]


topk = top_k
