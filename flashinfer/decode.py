"""Decode attention (upstream module ``flashinfer.decode``): the public names only; the
machinery is in :mod:`flashinfer.attention`."""

from .attention.batch_decode import (  # noqa: F401
    BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)
from .attention.single import single_decode_with_kv_cache  # noqa: F401

__all__ = ["single_decode_with_kv_cache", "BatchDecodeWithPagedKVCacheWrapper",
           "CUDAGraphBatchDecodeWithPagedKVCacheWrapper"]
