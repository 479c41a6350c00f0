"""Representative Problems: a typical call of any op, built from :mod:`flashinfer.op_catalog` alone.

``flashinfer show-config`` and ``flashinfer explain`` need a :class:`~flashinfer.dispatch.Problem`
for an op without a call to summarise. :func:`representative` builds one generically: every
dtype role gets the same dtype (fp16 unless told; fp32 for sampling), except index roles (RoPE's positions), every
shape fact a typical LLM size (Llama-3-8B-like: head_dim 128, 32 query / 8 KV heads, hidden 4096),
lengths bucketed as the op modules bucket them, and the features implied by the shape (``gqa``
when there are fewer KV heads, ``head_dim_differs``, ``partial_rotary``) plus the ones asked for.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .device import DeviceFacts
from .dispatch import Problem
from .shape_buckets import length_bucket
from .op_catalog import op_spec

#: dtype of the roles that hold indices, not values (never take the ``dtype`` argument).
INDEX_ROLES: dict[str, str] = {"pos": "int64"}

#: typical value of every shape fact the catalog declares.
DEFAULT_FACTS: dict[str, int] = {
    "head_dim_qk": 128, "head_dim_vo": 128, "head_dim": 128, "rotary_dim": 128,
    "num_qo_heads": 32, "num_kv_heads": 8, "num_q_heads": 32, "num_k_heads": 8,
    "qo_len": 1024, "kv_len": 4096, "num_tokens": 1024, "num_rows": 128, "hidden_size": 4096,
    "batch_size": 64, "vocab_size": 128256, "num_draft": 4,
    "m": 128, "n": 8192, "k": 8192, "batch": 1, "num_groups": 8, "rows_per_group": 16,
    # batch attention: 64 requests of 1024 new tokens against 4096 cached ones, pages of 16
    "max_qo_len": 1024, "max_kv_len": 4096, "total_qo_len": 64 * 1024, "page_size": 16,
    "q_len_per_req": 1, "num_heads": 32, "num_states": 2,
    # fused all-reduce: DeepSeek-V3's hidden size over 8 tensor-parallel ranks
    "world_size": 8, "hidden_dim": 7168,
}

#: dtype of a family's value roles when the caller names none (sampling reads fp32 probs).
FAMILY_DTYPE: dict[str, str] = {"sampling": "float32", "gemm": "bfloat16", "comm": "bfloat16"}

#: per-op value dtypes where one dtype for every role cannot describe the op (fp8 GEMMs):
#: ``default`` replaces the family dtype when the caller names none; the other roles listed
#: keep their dtype whatever the caller names (an fp8 GEMM's output is bf16).
OP_DTYPES: dict[str, dict[str, str]] = {
    "bmm_fp8": {"default": "float8_e4m3fn", "out": "bfloat16"},
    "gemm_fp8_groupwise": {"default": "float8_e4m3fn", "out": "bfloat16"},
    "group_gemm_fp8_groupwise": {"default": "float8_e4m3fn", "out": "bfloat16"},
    "mm_fp4": {"default": "uint8", "out": "bfloat16"},  # packed e2m1 pairs
    "batch_mla": {"default": "bfloat16"},  # DeepSeek's latent attention runs in bf16
    "merge_state": {"s": "float32"},  # the lse is read as fp32 whatever the outputs' dtype
    "merge_states": {"s": "float32"},
}

#: per-op departures from DEFAULT_FACTS that the op's definition imposes.
#: (the MoE ops: a DeepSeek-V3-like layer, 256 experts, top-8, intermediate size 2048)
OP_FACTS: dict[str, dict[str, int]] = {
    "single_decode": {"qo_len": 1},
    "batch_decode": {"max_qo_len": 1, "total_qo_len": 64},
    "batch_prefill_ragged": {"page_size": 0},  # no pages: the wrappers' plan() says 0
    # DeepSeek-V3 decode on one GPU: 128 heads, latent 512 + RoPE 64, pages of 64
    "batch_mla": {"num_heads": 128, "head_dim_ckv": 512, "head_dim_kpe": 64, "max_qo_len": 1,
                  "total_qo_len": 64, "page_size": 64},
    # a video-diffusion-like map: 8192 x 8192 in blocks of 64
    "block_sparse_attention": {"block_rows": 64, "block_cols": 64, "num_rows": 8192,
                               "num_cols": 8192},
    "moe_routing": {"num_experts": 256, "top_k": 8},
    "fused_moe": {"num_experts": 256, "top_k": 8, "intermediate_size": 2048},
}

#: shape facts a feature brings when the caller sets none (already bucketed): a sampling call
#: with a scalar top-k of 50 has shape fact top_k = 64.
FEATURE_FACTS: dict[str, dict[str, int]] = {"top_k": {"top_k": 64}}

#: facts that are lengths / row counts: the op modules bucket them with ``length_bucket``.
BUCKETED_FACTS = frozenset({"qo_len", "kv_len", "num_tokens", "num_rows", "batch_size",
                            "vocab_size", "m", "batch", "max_qo_len", "max_kv_len",
                            "total_qo_len", "num_groups", "rows_per_group", "num_states",
                            "num_cols"})

#: short dtype spellings accepted besides the torch names.
DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
                 "float": "float32", "fp64": "float64", "fp8": "float8_e4m3fn",
                 "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def implied_features(op: str, shape: Mapping[str, int]) -> set[str]:
    """Features a call with these shape facts necessarily uses (only those the op declares)."""
    spec = op_spec(op)
    implied = set()
    if shape.get("num_qo_heads", 0) > shape.get("num_kv_heads", 1 << 30):
        implied.add("gqa")
    if "head_dim_qk" in shape and "head_dim_vo" in shape and shape["head_dim_qk"] != shape["head_dim_vo"]:
        implied.add("head_dim_differs")
    if "rotary_dim" in shape and "head_dim" in shape and shape["rotary_dim"] < shape["head_dim"]:
        implied.add("partial_rotary")
    return implied & set(spec.features)


def default_shape(op: str) -> dict[str, int]:
    """The typical (unbucketed) shape facts of ``op``."""
    spec = op_spec(op)
    facts = {fact: DEFAULT_FACTS[fact] for fact in spec.shape_facts if fact in DEFAULT_FACTS}
    facts.update(OP_FACTS.get(op, {}))
    return facts


def representative(op: str, device: DeviceFacts, *, dtype: str | None = None,
                   dtypes: Mapping[str, str] | None = None,
                   shape: Mapping[str, int] | None = None, features: Iterable[str] = (),
                   layout: str | None = None) -> Problem:
    """A Problem for a typical call of ``op`` on ``device``.

    ``dtype`` is every value role's dtype; ``dtypes`` sets single roles (``{"out":
    "bfloat16"}``; unknown roles raise ``ValueError`` listing the op's roles). ``shape``
    overrides individual facts (unknown facts raise ``ValueError`` listing the op's facts);
    ``features`` adds to the implied ones (unknown ones raise ``ValueError``); ``layout``
    defaults to the op's first layout (``NHD`` for attention), ``None`` if it has none.
    """
    spec = op_spec(op)
    pinned = OP_DTYPES.get(op, {})
    if dtype is None:
        dtype = pinned.get("default") or FAMILY_DTYPE.get(spec.family, "float16")
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    facts = default_shape(op)
    for fact, value in (shape or {}).items():
        if fact not in spec.shape_facts:
            raise ValueError(f"{op} has no shape fact {fact!r}; its facts: {', '.join(spec.shape_facts)}")
        if int(value) < 0:
            raise ValueError(f"shape fact {fact}={value} must be >= 0")
        facts[fact] = int(value)
    feats = set(features)
    unknown = feats - set(spec.features)
    if unknown:
        raise ValueError(f"{op} has no feature(s) {', '.join(sorted(unknown))}; "
                         f"its features: {', '.join(spec.features) or 'none'}")
    for feature in feats:
        for fact, value in FEATURE_FACTS.get(feature, {}).items():
            if fact in spec.shape_facts and fact not in (shape or {}):
                facts[fact] = value
    feats |= implied_features(op, facts)
    if layout is None:
        layout = spec.layouts[0] if spec.layouts else None
    elif layout not in spec.layouts:
        raise ValueError(f"layout {layout!r} is not valid for {op}; "
                         f"valid: {', '.join(spec.layouts) or 'none (the op has no layout)'}")
    roles = {role: INDEX_ROLES.get(role, pinned.get(role, dtype)) for role in spec.dtype_roles}
    for role, name in (dtypes or {}).items():
        if role not in spec.dtype_roles:
            raise ValueError(f"{op} has no dtype role {role!r}; its roles: "
                             f"{', '.join(spec.dtype_roles)}")
        roles[role] = DTYPE_ALIASES.get(name, name)
    bucketed = {k: length_bucket(v) if k in BUCKETED_FACTS else v for k, v in facts.items()}
    return Problem.make(op, device, dtypes=roles, shape=bucketed, features=feats, layout=layout)
