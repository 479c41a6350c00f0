"""Upstream's module ``flashinfer.cascade``: attention state merging
(:mod:`flashinfer.attention.merge`), the multi-level cascade wrapper
(:mod:`flashinfer.attention.cascade_wrapper`) and the legacy shared-prefix wrappers
(:mod:`flashinfer.attention.shared_prefix`)."""

from .attention.cascade_wrapper import MultiLevelCascadeAttentionWrapper
from .attention.shared_prefix import (BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
                                      BatchPrefillWithSharedPrefixPagedKVCacheWrapper)
from .attention.merge import (merge_state, merge_state_in_place, merge_states,
                              variable_length_merge_states)

__all__ = ["BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
           "BatchPrefillWithSharedPrefixPagedKVCacheWrapper", "MultiLevelCascadeAttentionWrapper", "merge_state", "merge_state_in_place",
           "merge_states", "variable_length_merge_states"]
