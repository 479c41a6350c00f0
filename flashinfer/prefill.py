"""Prefill attention (upstream module ``flashinfer.prefill``): the public names only; the
machinery is in :mod:`flashinfer.attention`."""

from .attention.batch_prefill import (  # noqa: F401
    BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper,
)
from .attention.functional import trtllm_batch_context_with_kv_cache  # noqa: F401
from .attention.single import (  # noqa: F401
    single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse,
)

__all__ = ["single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse",
           "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
           "trtllm_batch_context_with_kv_cache"]
