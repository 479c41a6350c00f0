"""Upstream's module ``flashinfer.cudnn`` (its cuDNN attention calling conventions): the public
names only; the machinery is in :mod:`flashinfer.attention.functional`."""

from .attention.functional import cudnn_batch_decode_with_kv_cache  # noqa: F401

__all__ = ["cudnn_batch_decode_with_kv_cache"]
