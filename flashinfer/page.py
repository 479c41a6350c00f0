"""Paged KV-cache utilities (upstream module ``flashinfer.page``): the public names only; the
functions and their index rules are in :mod:`flashinfer.attention.page`."""

from .attention.page import (  # noqa: F401
    append_paged_kv_cache, append_paged_mla_kv_cache, get_batch_indices_positions, get_seq_lens,
    unpack_paged_kv_cache,
)

__all__ = ["append_paged_kv_cache", "append_paged_mla_kv_cache", "get_batch_indices_positions",
           "get_seq_lens", "unpack_paged_kv_cache"]
