"""Token sampling (upstream module ``flashinfer.sampling``): the functions and their rules are in
:mod:`flashinfer.sampling.ops`, their argument checks in :mod:`flashinfer.sampling.args`."""

from .ops import (  # noqa: F401
    softmax, sampling_from_logits, sampling_from_probs, top_p_sampling_from_probs,
    top_k_sampling_from_probs, min_p_sampling_from_probs, top_k_top_p_sampling_from_probs,
    top_k_top_p_sampling_from_logits, top_p_renorm_probs, top_p_renorm_prob, top_k_renorm_probs,
    top_k_renorm_prob, top_k_mask_logits, chain_speculative_sampling, get_seed_and_offset,
)

__all__ = [
    "softmax", "sampling_from_logits", "sampling_from_probs", "top_p_sampling_from_probs",
    "top_k_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits", "top_p_renorm_probs", "top_p_renorm_prob",
    "top_k_renorm_probs", "top_k_renorm_prob", "top_k_mask_logits", "chain_speculative_sampling",
    "get_seed_and_offset",
]
