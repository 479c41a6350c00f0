"""flashinfer: FlashInfer's public API on top of a backend-dispatch facade.

Every call is routed by the capability database and dispatch rules to the best available kernel
(cuDNN, FlashAttention, CUTLASS, TensorRT-LLM, torch, our Triton kernels, or the PyTorch
reference). See :mod:`flashinfer.dispatch` for how, and ``flashinfer explain`` for why.
"""

from __future__ import annotations

#: Version policy. ``__version__`` is the upstream FlashInfer release whose public API this
#: package matches (names, signatures, defaults: ../shared/api-spec.md studies 0.6.18), because
#: engines compare ``flashinfer.__version__`` against upstream releases to choose code paths.
#: This package's own release (pyproject.toml, what pip shows) is ``__package_version__``;
#: ``flashinfer --version`` and ``show-config`` print both.
__version__ = "0.6.18"
__package_version__ = "0.1.0"

from . import activation, decode, norm, prefill, rope, utils  # noqa: F401
from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul  # noqa: F401
from .attention.params import get_alibi_slopes  # noqa: F401
from .decode import single_decode_with_kv_cache  # noqa: F401
from .dispatch import (  # noqa: F401
    BackendUnavailableError, Decision, NoBackendError, Problem, Reason, StrictModeError,
    record_decisions, select,
)
from .norm import (  # noqa: F401
    fused_add_rmsnorm, fused_add_rmsnorm_quant, gemma_fused_add_rmsnorm, gemma_rmsnorm, layernorm,
    layernorm_quant, rmsnorm, rmsnorm_quant,
)
from .index_checks import check_errors  # noqa: F401
from .utils import next_positive_power_of_2  # noqa: F401
from . import topk  # noqa: F401  (upstream's module flashinfer.topk)
from .autotuner import autotune  # noqa: F401
from .topk import TopKTieBreak, top_k, top_k_page_table_transform, top_k_ragged_transform  # noqa: F401
from .overrides import use_backend  # noqa: F401
from .prefill import (  # noqa: F401
    single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse,
)
from . import sampling  # noqa: F401
from .sampling import (  # noqa: F401
    chain_speculative_sampling, min_p_sampling_from_probs, sampling_from_logits,
    sampling_from_probs, softmax, top_k_mask_logits, top_k_renorm_probs, top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits, top_k_top_p_sampling_from_probs, top_p_renorm_probs,
    top_p_sampling_from_probs,
)
from .rope import (  # noqa: F401
    apply_llama31_rope, apply_llama31_rope_inplace, apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace, apply_rope, apply_rope_inplace, apply_rope_pos_ids,
    apply_rope_pos_ids_inplace, apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)
from . import page  # noqa: F401,E402
from .decode import (  # noqa: F401,E402
    BatchDecodeMlaWithPagedKVCacheWrapper,
    BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    fast_decode_plan, trtllm_batch_decode_with_kv_cache, xqa_batch_decode_with_kv_cache,
)
from .page import (  # noqa: F401,E402
    append_paged_kv_cache, append_paged_mla_kv_cache, get_batch_indices_positions, get_seq_lens,
)
from .cudnn import cudnn_batch_decode_with_kv_cache, cudnn_batch_prefill_with_kv_cache  # noqa: F401,E402
from .prefill import (  # noqa: F401,E402
    BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper,
    trtllm_batch_context_with_kv_cache,
)
from . import cascade  # noqa: F401,E402
from .cascade import (  # noqa: F401,E402
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper, BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper, merge_state, merge_state_in_place, merge_states,
)
from . import sparse  # noqa: F401,E402
from .sparse import BlockSparseAttentionWrapper, VariableBlockSparseAttentionWrapper  # noqa: F401,E402
from . import pod  # noqa: F401,E402
from .pod import BatchPODWithPagedKVCacheWrapper, PODWithPagedKVCacheWrapper  # noqa: F401,E402
from . import attention  # noqa: E402
from .attention.mixed_batch import BatchAttention  # noqa: E402
# upstream's spelling flashinfer.attention.BatchAttention: the name is put on the family package
# from here, so that package's __init__ (below the wrappers) imports none of them
attention.BatchAttention = BatchAttention
from . import mla  # noqa: F401,E402
from .mla import BatchMLAPagedAttentionWrapper  # noqa: F401,E402
from . import gemm, quantization  # noqa: F401,E402
from .gemm import bmm_fp8, mm_bf16, mm_fp8  # noqa: F401,E402
from .gemm import SegmentGEMMWrapper, grouped_mm_bf16, grouped_mm_fp8  # noqa: F401,E402
from . import fused_moe  # noqa: F401,E402
from .fused_moe import (  # noqa: F401,E402
    ActivationType, RoutingMethodType, cutlass_fused_moe, fused_topk_deepseek, trtllm_bf16_moe,
    trtllm_fp4_block_scale_moe, trtllm_fp8_block_scale_moe, trtllm_fp8_per_tensor_scale_moe,
)
from . import fp4_quantization  # noqa: F401,E402
from .gemm import mm_fp4  # noqa: F401,E402
from .quantization import (  # noqa: F401,E402
    SfLayout, block_scale_interleave, e2m1_and_ufp8sf_scale_to_float, fp4_quantize,
    mxfp4_dequantize, mxfp4_dequantize_host, mxfp4_quantize, nvfp4_block_scale_interleave,
    nvfp4_quantize, packbits, segment_packbits,
)
