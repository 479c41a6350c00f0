"""The ops the dispatcher knows: each op's family, dtype roles, shape facts and features.

A capability record (capability_db/*.toml) and a dispatch rule (dispatch_rules/*.toml) may only
name ops, dtype roles, shape facts and features declared here; the loaders reject anything else,
so a typo in a data file is an error naming the file and key, not a silently ignored line.

Shape facts are the sizes that decide whether a kernel can run (head dims, head counts) or which
kernel is fastest (lengths, bucketed to powers of two by the op modules so the Decision cache
stays small). Features are the optional behaviours a call uses; a record lists the ones it serves.

:data:`PUBLIC_FUNCTIONS` maps every public function of upstream's API that dispatches (and each
batch wrapper class) to the op(s) it becomes, with the features a typical call of it uses, so
``flashinfer explain mm_fp8`` explains the ``bmm_fp8`` decision that ``mm_fp8`` makes;
:data:`NOT_DISPATCHED` names the public functions that dispatch nothing. Imports nothing of the
package.
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = ("attention", "norm", "rope", "activation", "gemm", "moe", "sampling", "comm")

ATTENTION_FEATURES = (
    "large_sm_scale",  # softmax scale > attention.params.LARGE_SOFTMAX_SCALE (up to the 1e4 limit)
    "causal",          # bottom-right aligned causal mask
    "gqa",             # num_qo_heads > num_kv_heads
    "window",          # window_left >= 0
    "soft_cap",        # logits_soft_cap > 0
    "alibi",           # pos_encoding_mode="ALIBI"
    "rope_llama",      # pos_encoding_mode="ROPE_LLAMA" (RoPE applied inside the kernel)
    "custom_mask",     # boolean mask (custom_mask / packed_custom_mask)
    "lse",             # return_lse=True (base-2 log-sum-exp)
    "head_dim_differs",  # head_dim_qk != head_dim_vo
    "kv_dtype_differs",  # k/v dtype differs from q dtype
    "o_dtype_differs",   # output dtype differs from q dtype
)

BATCH_ATTENTION_FEATURES = (
    "causal",          # bottom-right aligned causal mask per request
    "gqa",             # num_qo_heads > num_kv_heads
    "window",          # window_left >= 0
    "soft_cap",        # logits_soft_cap > 0
    "rope_llama",      # pos_encoding_mode="ROPE_LLAMA": RoPE on q (row r at kv_len - qo_len + r), k (j)
    "alibi",           # pos_encoding_mode="ALIBI": bias slope_h * (j - r)
    "sinks",           # per-head attention-sink logits (run(sinks=...))
    "custom_mask",     # flattened per-request boolean masks (prefill)
    "lse",             # return_lse=True (base-2 log-sum-exp)
    "fp8_kv",          # KV cache in float8_e4m3fn / float8_e5m2, k_scale / v_scale applied
    "multi_query",     # decode with q_len_per_req > 1 (causal inside each request)
    "head_dim_differs",  # head_dim_qk != head_dim_vo (ragged, e.g. 192/128)
    "o_dtype_differs",   # output dtype differs from q dtype
    "cuda_graph",      # wrapper built with use_cuda_graph=True (fixed buffers, capturable run)
)

BLOCK_SPARSE_FEATURES = (
    "causal",          # each row block's last query aligned with its last selected key
    "gqa",             # num_qo_heads > num_kv_heads
    "soft_cap",        # logits_soft_cap > 0
    "rope_llama",      # pos_encoding_mode="ROPE_LLAMA"
    "custom_mask",     # a bool mask [nnz, R, C] inside the blocks
    "packed_mask",     # the same mask bit-packed (convert_bsr_mask_layout's layout)
    "lse",             # return_lse=True (base-2 log-sum-exp)
    "fp8_kv",          # k / v in float8 with scale_k / scale_v
    "o_dtype_differs",  # output dtype differs from q dtype (upstream's default: float16)
)

MLA_FEATURES = (
    "causal",          # bottom-right aligned causal mask per request (q_len > 1)
    "lse",             # return_lse=True (base 2, or base e on request)
    "fp8_kv",          # ckv / kpe caches in float8_e4m3fn, ckv_scale / kpe_scale applied
    "multi_query",     # more than one query token in some request (MTP / speculative decoding)
    "varying_qo_len",  # the requests' query lengths differ (a kernel taking [B, q_len, ...] cannot)
    "separate_caches",  # ckv_cache / kpe_cache are not views of one [pages, page, ckv + kpe] buffer
    "cuda_graph",      # wrapper built with use_cuda_graph=True (fixed buffers, capturable run)
)

SAMPLING_FEATURES = (
    "top_k",           # keep the k most probable tokens (count of strictly larger < k)
    "top_k_per_row",   # top_k given as a tensor, one k per row (else a scalar, shape fact top_k)
    "top_p",           # keep the nucleus (mass of strictly larger < top_p)
    "min_p",           # keep p >= min_p * max(p)
    "joint",           # top-k and top-p applied together (filter_apply_order="joint")
    "indices",         # output i samples from row indices[i]
    "seed_tensor",     # seed / offset given as device tensors (CUDA-graph safe)
)

GEMM_FEATURES = (
    "bias",            # mm_bf16: a [n] bias added to the product
    "scale_rowwise",   # fp8 groupwise, granularity (1, 1, >=K): a scale per row of a and of b
    "scale_1x128",     # fp8 groupwise (1, 128, 128): DeepSeek-V3 activations 1x128, weights 128x128
    "scale_128x128",   # fp8 groupwise (128, 128, 128): gemm_fp8_nt_blockscaled
    "scale_groupwise",  # fp8 groupwise, any other granularity
)

MOE_ROUTING_FEATURES = (
    "bias",            # a routing bias (DeepSeek-V3 / MiniMax2: added to the sigmoid scores)
    "grouped_topk",    # DeepSeek-V3 group-limited top-k (n_group > 1)
)

MOE_FEATURES = (
    "fp8_block_scale",  # fp8 e4m3 experts with 128x128 weight / 1x128 activation block scales
    "fp8_per_tensor",   # fp8 e4m3 experts with per-expert scalar scales
    "geglu",            # GELU-gated activation (Geglu / GegluTanh) instead of SwiGLU
    "scales_on_input",  # routing weights applied to the expert input (Llama-4), not its output
)

_MOE_SHAPE = ("num_tokens", "hidden_size", "intermediate_size", "num_experts", "top_k")

_GEMM_SHAPE = ("m", "n", "k")  # m bucketed to a power of two; n and k exact (weight sizes)
# grouped / segment GEMM: the group count and total rows m bucketed; n and k exact
_GROUPED_GEMM_SHAPE = ("num_groups", "m", "n", "k")
# segment_gemm also: rows_per_group = m // num_groups of the unbucketed values, bucketed
_SEGMENT_GEMM_SHAPE = _GROUPED_GEMM_SHAPE + ("rows_per_group",)


@dataclass(frozen=True)
class OpSpec:
    name: str
    family: str
    dtype_roles: tuple[str, ...]
    shape_facts: tuple[str, ...]
    features: tuple[str, ...]
    layouts: tuple[str, ...] = ()
    doc: str = ""


_SAMPLING_SHAPE = ("batch_size", "vocab_size")  # both bucketed to powers of two
# sampling_from_probs, renorm_probs and top_k_mask_logits also have a scalar top_k's power-of-two
# bucket (absent for none or per row)
_SAMPLING_TOP_K_SHAPE = _SAMPLING_SHAPE + ("top_k",)
_ATTN_SHAPE = ("head_dim_qk", "head_dim_vo", "num_qo_heads", "num_kv_heads", "qo_len", "kv_len")
# batch_size, max_qo_len, max_kv_len and total_qo_len are bucketed to powers of two
_BATCH_SHAPE = ("head_dim_qk", "head_dim_vo", "num_qo_heads", "num_kv_heads", "batch_size",
                "max_qo_len", "max_kv_len", "total_qo_len", "page_size", "q_len_per_req")

# block-sparse: the block shape exactly, num_rows (M) and num_cols (N) bucketed to powers of two
_BLOCK_SPARSE_SHAPE = ("num_qo_heads", "num_kv_heads", "head_dim", "block_rows", "block_cols",
                       "num_rows", "num_cols")

# state merging: num_rows and num_states bucketed to powers of two
_MERGE_SHAPE = ("num_heads", "head_dim", "num_rows")

# batch_size, max_qo_len, max_kv_len and total_qo_len bucketed to powers of two
_MLA_SHAPE = ("num_heads", "head_dim_ckv", "head_dim_kpe", "batch_size", "max_qo_len",
              "max_kv_len", "total_qo_len", "page_size")

OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("single_decode", "attention", ("q", "kv", "o"), _ATTN_SHAPE, ATTENTION_FEATURES,
               ("NHD", "HND"), "one request, one query token against a contiguous KV"),
        OpSpec("single_prefill", "attention", ("q", "kv", "o"), _ATTN_SHAPE, ATTENTION_FEATURES,
               ("NHD", "HND"), "one request, qo_len query tokens against a contiguous KV"),
        OpSpec("batch_decode", "attention", ("q", "kv", "o"), _BATCH_SHAPE, BATCH_ATTENTION_FEATURES,
               ("NHD", "HND"), "paged KV cache, q_len_per_req query tokens per request"),
        OpSpec("batch_prefill_paged", "attention", ("q", "kv", "o"), _BATCH_SHAPE,
               BATCH_ATTENTION_FEATURES, ("NHD", "HND"), "ragged queries against a paged KV cache"),
        OpSpec("batch_prefill_ragged", "attention", ("q", "kv", "o"), _BATCH_SHAPE,
               BATCH_ATTENTION_FEATURES, ("NHD", "HND"), "ragged queries against ragged K/V"),
        OpSpec("batch_mla", "attention", ("q", "kv", "o"), _MLA_SHAPE, MLA_FEATURES, (),
               "multi-head latent attention (DeepSeek MLA): ragged queries, a paged latent cache"),
        OpSpec("block_sparse_attention", "attention", ("q", "kv", "o"), _BLOCK_SPARSE_SHAPE,
               BLOCK_SPARSE_FEATURES, (),
               "attention of q [M, H, D] over k / v [N, H_kv, D] restricted to a BSR map of "
               "R x C blocks"),
        OpSpec("merge_state", "attention", ("v", "s"), _MERGE_SHAPE, ("in_place", "mask"), (),
               "merge two attention states per row (outputs and their base-2 lse)"),
        OpSpec("merge_states", "attention", ("v", "s"), _MERGE_SHAPE + ("num_states",),
               ("variable_length",), (),
               "merge num_states attention states per row (or each row's indptr range) into one"),
        OpSpec("append_paged_kv", "attention", ("kv",), ("num_kv_heads", "head_dim", "page_size",
                                                     "num_tokens"), (), ("NHD", "HND"),
               "scatter new K/V tokens into a paged KV cache"),
        OpSpec("rmsnorm", "norm", ("input", "weight"), ("hidden_size", "num_rows"),
               ("fused_add", "gemma_weight", "per_head"), (), "RMSNorm, optionally fused residual add"),
        OpSpec("layernorm", "norm", ("input", "weight"), ("hidden_size", "num_rows"), (), (),
               "LayerNorm with fp32 gamma/beta"),
        OpSpec("rope", "rope", ("input", "pos"), ("head_dim", "rotary_dim", "num_q_heads",
                                                   "num_k_heads", "num_tokens"),
               ("interleave", "llama31", "partial_rotary", "cos_sin_cache", "inplace"), (),
               "rotary embedding of q and k at given positions"),
        OpSpec("act_and_mul", "activation", ("input",), ("hidden_size", "num_rows"),
               ("silu", "gelu", "gelu_tanh"), (), "act(x[..., :d]) * x[..., d:]"),
        OpSpec("sampling_from_probs", "sampling", ("probs",), _SAMPLING_TOP_K_SHAPE,
               SAMPLING_FEATURES, (),
               "draw one token per row from probabilities, optionally top-k/top-p/min-p"),
        OpSpec("sampling_from_logits", "sampling", ("logits",), _SAMPLING_SHAPE,
               ("indices", "seed_tensor"), (), "draw one token per row from softmax(logits)"),
        OpSpec("top_k_top_p_sampling_from_logits", "sampling", ("logits",), _SAMPLING_TOP_K_SHAPE,
               ("top_k", "top_k_per_row", "top_p", "joint", "indices", "seed_tensor"), (),
               "draw one token per row from softmax(logits) under top-k and top-p"),
        OpSpec("renorm_probs", "sampling", ("probs",), _SAMPLING_TOP_K_SHAPE,
               ("top_k", "top_k_per_row", "top_p"), (),
               "zero the probabilities outside top-k / top-p and renormalise"),
        OpSpec("top_k_mask_logits", "sampling", ("logits",), _SAMPLING_TOP_K_SHAPE,
               ("top_k_per_row",), (),
               "set logits outside the top-k to -inf"),
        OpSpec("softmax", "sampling", ("logits",), _SAMPLING_SHAPE, ("temperature",), (),
               "row softmax in fp32, optionally with a per-row temperature"),
        # num_tokens bucketed to a power of two; symmetric_workspace 1 when the workspace holds
        # symmetric buffers (the one-shot kernels need them)
        # features: residual add + RMSNorm, Gemma weight, then at most one fp8 quantisation of
        # the normed output: per-tensor scale / per-token dynamic scale / per-token-group UE8M0
        OpSpec("allreduce_fusion", "comm", ("input",),
               ("world_size", "hidden_dim", "num_tokens", "symmetric_workspace"),
               ("residual_rmsnorm", "gemma_weight", "fp8_quant", "fp8_dynamic_quant",
                "fp8_group_quant"), (),
               "all-reduce over a process group, optionally + residual add + RMSNorm (+ fp8 "
               "quantisation)"),
        OpSpec("chain_speculative_sampling", "sampling", ("probs",),
               ("batch_size", "vocab_size", "num_draft"), ("seed_tensor",), (),
               "accept/reject a chain of draft tokens against target probabilities"),
        OpSpec("mm_bf16", "gemm", ("a", "b", "out"), _GEMM_SHAPE, ("bias",), (),
               "out[m,n] = a[m,k] @ b[k,n] (+ bias), bf16 inputs, fp32 accumulation"),
        OpSpec("bmm_fp8", "gemm", ("a", "b", "out"), ("batch",) + _GEMM_SHAPE, (), (),
               "out[b] = (A[b] * A_scale) @ (B[b] * B_scale), fp8 inputs, per-tensor scales"),
        OpSpec("gemm_fp8_groupwise", "gemm", ("a", "b", "out"), _GEMM_SHAPE,
               ("scale_rowwise", "scale_1x128", "scale_128x128", "scale_groupwise"), (),
               "out = dequant(a) @ dequant(b).T, fp8 a [m,k] / b [n,k] with block scales"),
        OpSpec("moe_routing", "moe", ("logits",), ("num_tokens", "num_experts", "top_k"),
               MOE_ROUTING_FEATURES, (), "router logits [T, E] -> top-k expert ids and weights"),
        OpSpec("fused_moe", "moe", ("hidden", "weight", "out"), _MOE_SHAPE, MOE_FEATURES, (),
               "routed experts: gated gemm1, activation, gemm2, weighted sum over top-k"),
        OpSpec("segment_gemm", "gemm", ("x", "weights", "out"), _SEGMENT_GEMM_SHAPE,
               ("weight_indices",), ("row_major", "column_major"),
               "out[seg] = x[seg] @ W[weight_indices[i] or i] per segment (LoRA / grouped GEMM); "
               "layout is the weights' (column_major: [num_weights, n, k])"),
        OpSpec("group_gemm_fp8_groupwise", "gemm", ("a", "b", "out"), _GROUPED_GEMM_SHAPE,
               ("scale_rowwise", "scale_1x128", "scale_128x128", "scale_groupwise"), (),
               "out[seg g] = dequant(a[seg g]) @ dequant(b[g]).T, fp8 with block scales"),
        OpSpec("mm_fp4", "gemm", ("a", "b", "out"), _GEMM_SHAPE,
               ("mxfp4",    # MXFP4: blocks of 32, UE8M0 scales (else NVFP4: 16, e4m3)
                "sf_8x4"),  # a's scales in the 8x4 swizzled layout (else 128x4)
               (), "out = alpha * dequant(a) @ dequant(b), packed e2m1 a [m, k/2] / "
                   "b [k/2, n] with swizzled block scales"),
    )
}


def op_spec(op: str) -> OpSpec:
    try:
        return OPS[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; known ops: {', '.join(sorted(OPS))}") from None


# --------------------------------------------------------------------------------------------
# public functions -> ops


@dataclass(frozen=True)
class PublicFunction:
    """One public function (or wrapper class) of upstream's API and the op(s) it dispatches.

    ``features``, ``dtypes`` and ``layout`` describe a typical call, with upstream's defaults
    for the arguments that have one (``top_p_sampling_from_probs`` always filters by top-p;
    ``grouped_mm_fp8`` reads fp8 into a bf16 output), so ``flashinfer explain NAME`` builds the
    Problem such a call builds. A feature applies to the ops that declare it, a dtype to the
    ops that have that role.
    """

    name: str
    module: str  # upstream's module of it, e.g. "flashinfer.gemm"
    ops: tuple[str, ...]  # the ops one call dispatches, in call order
    features: tuple[str, ...] = ()
    dtypes: tuple[tuple[str, str], ...] = ()  # (role, dtype) pairs of a typical call
    layout: str | None = None
    note: str = ""


_WRAPPER = "decides in plan(); run() launches the planned kernel"
_FUNCTIONAL = "a block-table calling convention: plans a batch wrapper and runs it, per call"
_BF16_EXPERTS = (("hidden", "bfloat16"), ("weight", "bfloat16"), ("out", "bfloat16"))
_FP8_EXPERTS = (("hidden", "float8_e4m3fn"), ("weight", "float8_e4m3fn"), ("out", "bfloat16"))
_LOGITS = (("logits", "float32"),)  # router logits, as DeepSeek-V3 passes them
_ROUTING = "routes (moe_routing), then runs the experts (fused_moe)"


def _rope(name: str, *features: str) -> PublicFunction:
    return PublicFunction(name, "flashinfer.rope", ("rope",),
                          features + (("inplace",) if name.endswith("_inplace") else ()))


PUBLIC_FUNCTIONS: dict[str, PublicFunction] = {
    f.name: f
    for f in (
        PublicFunction("single_decode_with_kv_cache", "flashinfer.decode", ("single_decode",)),
        PublicFunction("BatchDecodeWithPagedKVCacheWrapper", "flashinfer.decode",
                       ("batch_decode",), note=_WRAPPER),
        PublicFunction("CUDAGraphBatchDecodeWithPagedKVCacheWrapper", "flashinfer.decode",
                       ("batch_decode",), ("cuda_graph",), note=_WRAPPER),
        PublicFunction("trtllm_batch_decode_with_kv_cache", "flashinfer.decode",
                       ("batch_decode",), note=_FUNCTIONAL),
        PublicFunction("xqa_batch_decode_with_kv_cache", "flashinfer.decode", ("batch_decode",),
                       note=_FUNCTIONAL),
        PublicFunction("trtllm_batch_context_with_kv_cache", "flashinfer.prefill",
                       ("batch_prefill_paged",), ("causal",), note=_FUNCTIONAL),
        PublicFunction("cudnn_batch_decode_with_kv_cache", "flashinfer.cudnn",
                       ("batch_decode",), note=_FUNCTIONAL),
        PublicFunction("cudnn_batch_prefill_with_kv_cache", "flashinfer.cudnn",
                       ("batch_prefill_paged", "batch_prefill_ragged"), ("causal",),
                       note=_FUNCTIONAL),
        PublicFunction("fast_decode_plan", "flashinfer.decode", ("batch_decode",),
                       note="a decode wrapper's plan() (bound onto it); run() then decides nothing"),
        PublicFunction("single_prefill_with_kv_cache", "flashinfer.prefill", ("single_prefill",)),
        PublicFunction("single_prefill_with_kv_cache_return_lse", "flashinfer.prefill",
                       ("single_prefill",), ("lse",)),
        PublicFunction("BatchPrefillWithPagedKVCacheWrapper", "flashinfer.prefill",
                       ("batch_prefill_paged",), note=_WRAPPER),
        PublicFunction("BatchPrefillWithRaggedKVCacheWrapper", "flashinfer.prefill",
                       ("batch_prefill_ragged",), note=_WRAPPER),
        PublicFunction("BatchMLAPagedAttentionWrapper", "flashinfer.mla", ("batch_mla",),
                       note=_WRAPPER),
        PublicFunction("BatchDecodeMlaWithPagedKVCacheWrapper", "flashinfer.decode",
                       ("batch_mla",), note="upstream's older MLA decode wrapper, planned on the "
                                            "MLA wrapper"),
        PublicFunction("trtllm_batch_decode_with_kv_cache_mla", "flashinfer.mla", ("batch_mla",),
                       note="a block-table calling convention: plans an MLA wrapper and runs it, "
                            "per call"),
        PublicFunction("xqa_batch_decode_with_kv_cache_mla", "flashinfer.mla", ("batch_mla",),
                       note="a block-table calling convention: plans an MLA wrapper and runs it, "
                            "per call"),
        PublicFunction("merge_state", "flashinfer.cascade", ("merge_state",)),
        PublicFunction("merge_state_in_place", "flashinfer.cascade", ("merge_state",),
                       ("in_place",)),
        PublicFunction("merge_states", "flashinfer.cascade", ("merge_states",)),
        PublicFunction("BatchDecodeWithSharedPrefixPagedKVCacheWrapper", "flashinfer.cascade",
                       ("single_prefill", "batch_decode", "merge_state"), ("lse",),
                       note="the shared prefix as one prefill of every query, the unique pages "
                            "by batch decode, merged"),
        PublicFunction("BatchPrefillWithSharedPrefixPagedKVCacheWrapper", "flashinfer.cascade",
                       ("single_prefill", "batch_prefill_paged", "merge_state"), ("lse",),
                       note="the shared prefix as one prefill of every query, the unique pages "
                            "by paged prefill, merged"),
        PublicFunction("MultiLevelCascadeAttentionWrapper", "flashinfer.cascade",
                       ("batch_prefill_paged", "merge_state"), ("lse", "in_place"),
                       note="plans one batch paged prefill per level in plan(); run() merges "
                            "the levels' states"),
        PublicFunction("BlockSparseAttentionWrapper", "flashinfer.sparse",
                       ("block_sparse_attention", "batch_prefill_paged"),
                       note="flex_attention over a BlockMask, or a batch paged prefill (row blocks "
                            "as requests, column blocks as pages of gcd(C, 64) tokens) on the "
                            "kernel the block_sparse_attention Decision names"),
        PublicFunction("VariableBlockSparseAttentionWrapper", "flashinfer.sparse",
                       ("batch_prefill_paged",), ("lse",),
                       note="a batch paged prefill of one request per (KV head, row block), "
                            "pages of one token"),
        PublicFunction("PODWithPagedKVCacheWrapper", "flashinfer.pod",
                       ("single_prefill", "batch_decode"),
                       note="the prefill on a side stream, the decode on the caller's"),
        PublicFunction("BatchPODWithPagedKVCacheWrapper", "flashinfer.pod",
                       ("batch_prefill_paged", "batch_decode"),
                       note="the prefill batch on a side stream, the decode batch on the "
                            "caller's"),
        PublicFunction("BatchAttention", "flashinfer.attention",
                       ("batch_prefill_paged", "batch_decode"), ("lse",),
                       note="one-token requests to the batch decode, the others to the batch "
                            "prefill, on two streams"),
        PublicFunction("append_paged_kv_cache", "flashinfer.page", ("append_paged_kv",)),
        PublicFunction("append_paged_mla_kv_cache", "flashinfer.page", ("append_paged_kv",),
                       note="the append op with one latent head per cache (ckv, kpe)"),
        PublicFunction("rmsnorm", "flashinfer.norm", ("rmsnorm",)),
        PublicFunction("fused_add_rmsnorm", "flashinfer.norm", ("rmsnorm",), ("fused_add",)),
        PublicFunction("gemma_rmsnorm", "flashinfer.norm", ("rmsnorm",), ("gemma_weight",)),
        PublicFunction("rmsnorm_quant", "flashinfer.norm", ("rmsnorm",),
                       note="the RMSNorm op in float32, then the fp8 scale, clamp and cast"),
        PublicFunction("fused_add_rmsnorm_quant", "flashinfer.norm", ("rmsnorm",),
                       note="residual += input, the RMSNorm op in float32, then the fp8 cast"),
        PublicFunction("gemma_fused_add_rmsnorm", "flashinfer.norm", ("rmsnorm",),
                       ("fused_add", "gemma_weight")),
        PublicFunction("layernorm", "flashinfer.norm", ("layernorm",)),
        PublicFunction("layernorm_quant", "flashinfer.norm", ("layernorm",)),
        PublicFunction("allreduce_fusion", "flashinfer.comm", ("allreduce_fusion",),
                       ("residual_rmsnorm",), (("input", "bfloat16"),)),
        PublicFunction("trtllm_allreduce_fusion", "flashinfer.comm", ("allreduce_fusion",),
                       ("residual_rmsnorm",), (("input", "bfloat16"),),
                       note="upstream's legacy flat-tensor form of allreduce_fusion"),
        PublicFunction("trtllm_custom_all_reduce", "flashinfer.comm", ("allreduce_fusion",),
                       dtypes=(("input", "bfloat16"),),
                       note="fusion op NONE / RESIDUAL_RMS_NORM as allreduce_fusion patterns 0 / 1"),
        PublicFunction("vllm_all_reduce", "flashinfer.comm", ("allreduce_fusion",),
                       dtypes=(("input", "bfloat16"),),
                       note="vLLM's custom all-reduce: allreduce_fusion pattern 0"),
        _rope("apply_rope"),
        _rope("apply_rope_inplace"),
        _rope("apply_rope_pos_ids"),
        _rope("apply_rope_pos_ids_inplace"),
        _rope("apply_llama31_rope", "llama31"),
        _rope("apply_llama31_rope_inplace", "llama31"),
        _rope("apply_llama31_rope_pos_ids", "llama31"),
        _rope("apply_llama31_rope_pos_ids_inplace", "llama31"),
        _rope("apply_rope_with_cos_sin_cache", "cos_sin_cache"),
        _rope("apply_rope_with_cos_sin_cache_inplace", "cos_sin_cache"),
        _rope("rope_quantize_fp8", "cos_sin_cache", "inplace"),  # (on float32 copies)
        _rope("mla_rope_quantize_fp8", "cos_sin_cache", "inplace"),
        _rope("rope_quantize_fp8_append_paged_kv_cache", "cos_sin_cache", "inplace"),
        PublicFunction("silu_and_mul", "flashinfer.activation", ("act_and_mul",), ("silu",)),
        PublicFunction("gelu_and_mul", "flashinfer.activation", ("act_and_mul",), ("gelu",)),
        PublicFunction("gelu_tanh_and_mul", "flashinfer.activation", ("act_and_mul",),
                       ("gelu_tanh",)),
        PublicFunction("sampling_from_probs", "flashinfer.sampling", ("sampling_from_probs",)),
        PublicFunction("top_p_sampling_from_probs", "flashinfer.sampling",
                       ("sampling_from_probs",), ("top_p",)),
        PublicFunction("top_k_sampling_from_probs", "flashinfer.sampling",
                       ("sampling_from_probs",), ("top_k",)),
        PublicFunction("min_p_sampling_from_probs", "flashinfer.sampling",
                       ("sampling_from_probs",), ("min_p",)),
        PublicFunction("top_k_top_p_sampling_from_probs", "flashinfer.sampling",
                       ("sampling_from_probs",), ("top_k", "top_p")),
        PublicFunction("sampling_from_logits", "flashinfer.sampling", ("sampling_from_logits",)),
        PublicFunction("top_k_top_p_sampling_from_logits", "flashinfer.sampling",
                       ("top_k_top_p_sampling_from_logits",), ("top_k", "top_p")),
        PublicFunction("top_p_renorm_probs", "flashinfer.sampling", ("renorm_probs",), ("top_p",)),
        PublicFunction("top_p_renorm_prob", "flashinfer.sampling", ("renorm_probs",), ("top_p",),
                       note="upstream's older name of top_p_renorm_probs"),
        PublicFunction("top_k_renorm_probs", "flashinfer.sampling", ("renorm_probs",), ("top_k",)),
        PublicFunction("top_k_renorm_prob", "flashinfer.sampling", ("renorm_probs",), ("top_k",),
                       note="upstream's older name of top_k_renorm_probs"),
        PublicFunction("top_k_mask_logits", "flashinfer.sampling", ("top_k_mask_logits",)),
        PublicFunction("softmax", "flashinfer.sampling", ("softmax",)),
        PublicFunction("chain_speculative_sampling", "flashinfer.sampling",
                       ("chain_speculative_sampling",)),
        PublicFunction("mm_bf16", "flashinfer.gemm", ("mm_bf16",)),
        PublicFunction("bmm_fp8", "flashinfer.gemm", ("bmm_fp8",)),
        PublicFunction("mm_fp8", "flashinfer.gemm", ("bmm_fp8",),
                       note="a bmm_fp8 of batch 1 (alpha as A's scale)"),
        PublicFunction("gemm_fp8_nt_groupwise", "flashinfer.gemm", ("gemm_fp8_groupwise",),
                       ("scale_1x128",)),
        PublicFunction("gemm_fp8_nt_blockscaled", "flashinfer.gemm", ("gemm_fp8_groupwise",),
                       ("scale_128x128",)),
        PublicFunction("group_gemm_fp8_nt_groupwise", "flashinfer.gemm",
                       ("group_gemm_fp8_groupwise",), ("scale_1x128",)),
        PublicFunction("mm_fp4", "flashinfer.gemm", ("mm_fp4",)),
        PublicFunction("grouped_mm_bf16", "flashinfer.grouped_mm", ("segment_gemm",),
                       dtypes=(("x", "bfloat16"), ("weights", "bfloat16"), ("out", "bfloat16")),
                       layout="column_major"),
        PublicFunction("grouped_mm_fp8", "flashinfer.grouped_mm", ("segment_gemm",),
                       dtypes=(("x", "float8_e4m3fn"), ("weights", "float8_e4m3fn"),
                               ("out", "bfloat16")), layout="column_major"),
        PublicFunction("SegmentGEMMWrapper", "flashinfer.gemm", ("segment_gemm",),
                       note="run() decides and launches"),
        PublicFunction("cutlass_fused_moe", "flashinfer.fused_moe", ("fused_moe",),
                       dtypes=_BF16_EXPERTS, note="experts only: the caller gives the routing"),
        PublicFunction("trtllm_bf16_moe", "flashinfer.fused_moe", ("moe_routing", "fused_moe"),
                       dtypes=_LOGITS + _BF16_EXPERTS, note=_ROUTING),
        PublicFunction("trtllm_fp8_per_tensor_scale_moe", "flashinfer.fused_moe",
                       ("moe_routing", "fused_moe"), ("fp8_per_tensor",), _LOGITS + _FP8_EXPERTS,
                       note=_ROUTING),
        PublicFunction("trtllm_fp8_block_scale_moe", "flashinfer.fused_moe",
                       ("moe_routing", "fused_moe"), ("fp8_block_scale",), _LOGITS + _FP8_EXPERTS,
                       note=_ROUTING),
        PublicFunction("trtllm_fp4_block_scale_moe", "flashinfer.fused_moe", ("fused_moe",),
                       dtypes=(("hidden", "uint8"), ("weight", "uint8"), ("out", "bfloat16")),
                       note="no backend serves FP4 MoE here: every call raises, listing why"),
        PublicFunction("fused_topk_deepseek", "flashinfer.fused_moe", ("moe_routing",),
                       ("bias", "grouped_topk"), _LOGITS),
    )
}

#: public functions that dispatch nothing (host helpers, quantisers with one implementation):
#: name -> upstream's module. ``flashinfer explain`` says so instead of "unknown name".
NOT_DISPATCHED: dict[str, str] = {
    **dict.fromkeys(("get_batch_indices_positions", "get_seq_lens", "unpack_paged_kv_cache"),
                    "flashinfer.page"),
    "get_alibi_slopes": "flashinfer",
    "autotune": "flashinfer",  # measures the kernels of the ops called inside it
    "next_positive_power_of_2": "flashinfer.utils",
    **dict.fromkeys(("top_k", "topk", "top_k_page_table_transform", "top_k_ragged_transform"),
                    "flashinfer.topk"),
    "get_seed_and_offset": "flashinfer.sampling",
    "create_allreduce_fusion_workspace": "flashinfer.comm",  # records the group and sizes
    # (IPC workspaces and handles that record the group and sizes; no-ops; refusals)
    **dict.fromkeys(("trtllm_create_ipc_workspace_for_all_reduce",
                     "trtllm_destroy_ipc_workspace_for_all_reduce",
                     "trtllm_create_ipc_workspace_for_all_reduce_fusion",
                     "trtllm_destroy_ipc_workspace_for_all_reduce_fusion",
                     "trtllm_lamport_initialize", "trtllm_lamport_initialize_all",
                     "trtllm_moe_allreduce_fusion", "trtllm_moe_finalize_allreduce_fusion",
                     "compute_fp4_swizzled_layout_sf_size", "vllm_init_custom_ar", "vllm_dispose",
                     "vllm_register_buffer", "vllm_register_graph_buffers",
                     "vllm_get_graph_buffer_ipc_meta", "vllm_meta_size"), "flashinfer.comm"),
    "is_gated_activation": "flashinfer.fused_moe",
    **dict.fromkeys(("per_token_group_quant_8bit", "quantize_fp8_per_tensor",
                     "quantize_fp8_per_token", "quantize_fp8_blockwise", "fp4_quantize",
                     "mxfp4_quantize", "mxfp4_dequantize", "mxfp4_dequantize_host",
                     "nvfp4_quantize", "block_scale_interleave", "nvfp4_block_scale_interleave",
                     "e2m1_and_ufp8sf_scale_to_float", "packbits", "segment_packbits"),
                    "flashinfer.quantization"),
}
