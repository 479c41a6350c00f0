"""Upstream's module ``flashinfer.sparse``: the block-sparse attention wrappers and the BSR mask
layout helper (:mod:`flashinfer.attention.block_sparse`)."""

from .attention.block_sparse import (BlockSparseAttentionWrapper,
                                     VariableBlockSparseAttentionWrapper, convert_bsr_mask_layout)

__all__ = ["BlockSparseAttentionWrapper", "VariableBlockSparseAttentionWrapper",
           "convert_bsr_mask_layout"]
