"""Upstream's ``flashinfer.triton.cascade``: the state merges of :mod:`flashinfer.attention.merge` run by
our Triton kernels (``backend="triton"``; on a machine without Triton they raise naming it)."""

from __future__ import annotations

from typing import Optional

import torch

from ..attention import merge as cascade

__all__ = ["merge_state", "merge_state_in_place", "merge_states", "variable_length_merge_states"]


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor):
    return cascade.merge_state(v_a, s_a, v_b, s_b, backend="triton")


def merge_state_in_place(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor,
                         s_other: torch.Tensor, mask: Optional[torch.Tensor] = None) -> None:
    cascade.merge_state_in_place(v, s, v_other, s_other, mask, backend="triton")


def merge_states(v: torch.Tensor, s: torch.Tensor):
    return cascade.merge_states(v, s, backend="triton")


def variable_length_merge_states(v: torch.Tensor, s: torch.Tensor, indptr: torch.Tensor):
    return cascade.variable_length_merge_states(v, s, indptr, backend="triton")
