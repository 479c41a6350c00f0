"""DeepSeek multi-head latent attention (upstream's ``flashinfer.mla``): the paged MLA wrapper
(:mod:`flashinfer.attention.mla_wrapper`). The math, the layouts and the backend contract:
:mod:`flashinfer.attention.mla_params`."""

from .attention.mla_functional import (
    trtllm_batch_decode_with_kv_cache_mla, xqa_batch_decode_with_kv_cache_mla,
)
from .attention.mla_wrapper import BatchMLAPagedAttentionWrapper

__all__ = ["BatchMLAPagedAttentionWrapper", "trtllm_batch_decode_with_kv_cache_mla",
           "xqa_batch_decode_with_kv_cache_mla"]
