"""Upstream's module ``flashinfer.cudnn`` (its cuDNN attention calling conventions): the public
names only; the machinery is in :mod:`flashinfer.attention.functional`."""

from .attention.functional import (  # noqa: F401
    cudnn_batch_decode_with_kv_cache, cudnn_batch_prefill_with_kv_cache,
)

__all__ = ["cudnn_batch_decode_with_kv_cache", "cudnn_batch_prefill_with_kv_cache"]
