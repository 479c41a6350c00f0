"""Decode attention (upstream module ``flashinfer.decode``): the public names only; the
machinery is in :mod:`flashinfer.attention`."""

from .attention.batch_decode import (  # noqa: F401
    BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    fast_decode_plan,
)
from .attention.batch_decode import get_range_buf as _get_range_buf  # noqa: F401
from .attention.batch_decode import (  # noqa: F401
    grouped_size_compiled_for_decode_kernels as _grouped_size_compiled_for_decode_kernels,
)
from .attention.functional import (  # noqa: F401
    trtllm_batch_decode_with_kv_cache, xqa_batch_decode_with_kv_cache,
)
from .attention.mla_functional import (  # noqa: F401  (upstream re-exports them here too)
    trtllm_batch_decode_with_kv_cache_mla, xqa_batch_decode_with_kv_cache_mla,
)
from .attention.mla_wrapper import BatchDecodeMlaWithPagedKVCacheWrapper  # noqa: F401
from .attention.single import single_decode_with_kv_cache  # noqa: F401

__all__ = ["single_decode_with_kv_cache", "BatchDecodeWithPagedKVCacheWrapper",
           "CUDAGraphBatchDecodeWithPagedKVCacheWrapper", "fast_decode_plan",
           "trtllm_batch_decode_with_kv_cache", "xqa_batch_decode_with_kv_cache",
           "trtllm_batch_decode_with_kv_cache_mla", "xqa_batch_decode_with_kv_cache_mla",
           "BatchDecodeMlaWithPagedKVCacheWrapper"]
