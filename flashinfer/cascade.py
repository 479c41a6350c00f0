"""Upstream's module ``flashinfer.cascade``: attention state merging
(:mod:`flashinfer.attention.merge`) and the multi-level cascade wrapper
(:mod:`flashinfer.attention.cascade_wrapper`)."""

from .attention.cascade_wrapper import MultiLevelCascadeAttentionWrapper
from .attention.merge import (merge_state, merge_state_in_place, merge_states,
                              variable_length_merge_states)

__all__ = ["MultiLevelCascadeAttentionWrapper", "merge_state", "merge_state_in_place",
           "merge_states", "variable_length_merge_states"]
