"""The paged-prefill mapping of ``block_sparse_attention`` (the records of flash_attn:fa3,
cuDNN, Triton and the reference): row block ``i`` is a request whose pages are its column
blocks. The wrapper plans that batch prefill on the kernel the Decision names (the family layer
owns the batch prefill wrapper) and hands its runner in ``plan.paged_run``; this kernel is that
runner (see :mod:`flashinfer.attention.block_sparse_params`)."""

from __future__ import annotations

from ...attention.block_sparse_params import BlockSparsePlan


def block_sparse(plan: BlockSparsePlan):
    if plan.paged_run is None:
        raise RuntimeError("the paged mapping was decided but its batch prefill was not planned")
    return plan.paged_run


__all__ = ["block_sparse"]
