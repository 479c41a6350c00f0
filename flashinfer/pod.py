"""Upstream's module ``flashinfer.pod``: prefill and decode in one call
(:mod:`flashinfer.attention.pod`)."""

from .attention.pod import BatchPODWithPagedKVCacheWrapper, PODWithPagedKVCacheWrapper

__all__ = ["BatchPODWithPagedKVCacheWrapper", "PODWithPagedKVCacheWrapper"]
