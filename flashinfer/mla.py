"""DeepSeek multi-head latent attention (upstream's ``flashinfer.mla``): the paged MLA wrapper
(:mod:`flashinfer.attention.mla_wrapper`). The math, the layouts and the backend contract:
:mod:`flashinfer.attention.mla_params`."""

from .attention.mla_wrapper import BatchMLAPagedAttentionWrapper

__all__ = ["BatchMLAPagedAttentionWrapper"]
