"""RoPE family (flashinfer.rope): argument validation (one test per rule) and dispatch
decisions on simulated devices."""

import pytest
import torch

import flashinfer
from flashinfer import rope
from flashinfer.dispatch import Problem, select
from flashinfer.rope import Llama31Factors


def make_qk(nnz, hq, hk, d, dtype):
    torch.manual_seed(0)
    return torch.randn(nnz, hq, d, dtype=dtype), torch.randn(nnz, hk, d, dtype=dtype)


# --------------------------------------------------------------------------------------------
# bad inputs: one test per rule


def good():
    q, k = make_qk(4, 2, 1, 16, torch.float16)
    return q, k, torch.arange(4)


BAD_QK = [
    ("q rank", lambda q, k: (q[0], k), ValueError, "q must be 3-D"),
    ("k rank", lambda q, k: (q, k[0]), ValueError, "k must be 3-D"),
    ("q dtype", lambda q, k: (q.double(), k.double()), TypeError, "q dtype"),
    ("k dtype", lambda q, k: (q, k.float()), TypeError, "k dtype"),
    ("k device", lambda q, k: (q, k.to("meta")), ValueError, "k is on meta"),
    ("k tokens", lambda q, k: (q, k[:3]), ValueError, "k has 3 tokens"),
    ("k head_dim", lambda q, k: (q, k[..., :8]), ValueError, "k head_dim"),
]


@pytest.mark.parametrize("name,mutate,exc,match", BAD_QK, ids=[b[0] for b in BAD_QK])
def test_bad_q_k(name, mutate, exc, match):
    q, k, pos = good()
    q, k = mutate(q, k)
    with pytest.raises(exc, match=match):
        rope.apply_rope_pos_ids(q, k, pos)


def test_q_not_a_tensor():
    _, k, pos = good()
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        rope.apply_rope_pos_ids([1.0], k, pos)


BAD_ARGS = [
    ("rotary_dim odd", dict(rotary_dim=7), ValueError, "rotary_dim=7"),
    ("rotary_dim too big", dict(rotary_dim=32), ValueError, "rotary_dim=32"),
    ("rotary_dim zero", dict(rotary_dim=0), ValueError, "rotary_dim=0"),
    ("rotary_dim type", dict(rotary_dim=8.0), TypeError, "rotary_dim"),
    ("interleave type", dict(interleave=1), TypeError, "interleave"),
    ("rope_scale zero", dict(rope_scale=0.0), ValueError, "rope_scale"),
    ("rope_scale nan", dict(rope_scale=float("nan")), ValueError, "rope_scale"),
    ("rope_theta negative", dict(rope_theta=-1.0), ValueError, "rope_theta"),
    ("rope_theta type", dict(rope_theta="1e4"), TypeError, "rope_theta"),
    ("rope_scale inf", dict(rope_scale=float("inf")), ValueError, "rope_scale"),
    ("rope_scale negative", dict(rope_scale=-2.0), ValueError, "rope_scale"),
    ("rope_scale subnormal", dict(rope_scale=1e-40), ValueError, "rope_scale.*float32"),
    ("rope_theta nan", dict(rope_theta=float("nan")), ValueError, "rope_theta"),
    ("rope_theta inf", dict(rope_theta=float("inf")), ValueError, "rope_theta"),
    ("rope_theta zero", dict(rope_theta=0.0), ValueError, "rope_theta"),
    ("rope_theta past float32", dict(rope_theta=1e39), ValueError, "rope_theta.*float32"),
]


@pytest.mark.parametrize("name,kwargs,exc,match", BAD_ARGS, ids=[b[0] for b in BAD_ARGS])
def test_bad_rope_arguments(name, kwargs, exc, match):
    q, k, pos = good()
    with pytest.raises(exc, match=match):
        rope.apply_rope_pos_ids(q, k, pos, **kwargs)


BAD_LLAMA = [
    ("low zero", dict(low_freq_factor=0.0), "low_freq_factor"),
    ("high equals low", dict(low_freq_factor=2.0, high_freq_factor=2.0), "high_freq_factor"),
    ("old_context_len zero", dict(old_context_len=0), "old_context_len"),
    ("low nan", dict(low_freq_factor=float("nan")), "low_freq_factor"),
    ("low inf", dict(low_freq_factor=float("inf")), "low_freq_factor"),
    ("high nan", dict(high_freq_factor=float("nan")), "high_freq_factor"),
    ("high inf", dict(high_freq_factor=float("inf")), "high_freq_factor"),
    ("high below low", dict(low_freq_factor=4.0, high_freq_factor=1.0), "high_freq_factor"),
    ("old_context_len nan", dict(old_context_len=float("nan")), "old_context_len"),
    ("old_context_len inf", dict(old_context_len=float("inf")), "old_context_len"),
    ("old_context_len negative", dict(old_context_len=-8192), "old_context_len"),
    ("factors too close", dict(low_freq_factor=1e-30, high_freq_factor=1.000001e-30), "too close"),
]


@pytest.mark.parametrize("name,kwargs,match", BAD_LLAMA, ids=[b[0] for b in BAD_LLAMA])
def test_bad_llama31_factors(name, kwargs, match):
    q, k, pos = good()
    with pytest.raises(ValueError, match=match):
        rope.apply_llama31_rope_pos_ids(q, k, pos, **kwargs)


BAD_POS = [
    ("dtype", lambda p: p.float(), TypeError, "pos_ids dtype"),
    ("rank", lambda p: p[None], ValueError, "pos_ids must be 1-D"),
    ("length", lambda p: p[:3], ValueError, "pos_ids has 3 entries"),
    ("device", lambda p: p.to("meta"), ValueError, "pos_ids is on meta"),
    ("type", lambda p: p.tolist(), TypeError, "pos_ids must be a torch.Tensor"),
]


@pytest.mark.parametrize("name,mutate,exc,match", BAD_POS, ids=[b[0] for b in BAD_POS])
def test_bad_pos_ids(name, mutate, exc, match):
    q, k, pos = good()
    with pytest.raises(exc, match=match):
        rope.apply_rope_pos_ids_inplace(q, k, mutate(pos))


BAD_RAGGED = [
    ("indptr dtype", [0.0, 2.0, 4.0], [0, 0], TypeError, "indptr dtype"),
    ("offsets dtype", [0, 2, 4], [0.0, 0.0], TypeError, "offsets dtype"),
    ("indptr size", [0, 4], [0, 0], ValueError, "indptr has 2 entries, expected 3"),
    ("indptr start", [1, 2, 4], [0, 0], ValueError, r"apply_rope: indptr\[0\] = 1 .*indptr\[0\] = 0"),
    ("indptr end", [0, 2, 3], [0, 0], ValueError, r"indptr\[2\] = 3 .*nnz = 4"),
    ("indptr past nnz", [0, 5, 4], [0, 0], ValueError, r"indptr\[1\] = 5 .*non-decreasing"),
    ("indptr decreasing", [0, 3, 2], [0, 0], ValueError, r"indptr\[2\] = 2 .*non-decreasing"),
]


@pytest.mark.parametrize("name,indptr,offsets,exc,match", BAD_RAGGED, ids=[b[0] for b in BAD_RAGGED])
def test_bad_ragged_indices(name, indptr, offsets, exc, match):
    q, k, _ = good()
    with pytest.raises(exc, match=match):
        rope.apply_rope(q, k, torch.tensor(indptr), torch.tensor(offsets))


def test_bad_offsets_rank():
    q, k, _ = good()
    with pytest.raises(ValueError, match="offsets must be 1-D"):
        rope.apply_llama31_rope_inplace(q, k, torch.tensor([0, 4]), torch.tensor([[0]]))


def cache_call(positions=None, query=None, key=None, head_size=16, cache=None, is_neox=True):
    q, k, pos = good()
    query = q.reshape(4, -1) if query is None else query
    key = k.reshape(4, -1) if key is None else key
    cache = torch.randn(8, 16) if cache is None else cache
    positions = pos if positions is None else positions
    return rope.apply_rope_with_cos_sin_cache(positions, query, key, head_size, cache, is_neox)


BAD_CACHE = [
    ("cache dtype", dict(cache=torch.randn(8, 16).half()), ValueError, "cos_sin_cache must be float32"),
    ("cache rank", dict(cache=torch.randn(16)), ValueError, "cos_sin_cache must be 2-D"),
    ("cache empty", dict(cache=torch.randn(0, 16)), ValueError, "cos_sin_cache has no rows"),
    ("cache width odd", dict(cache=torch.randn(8, 5)), ValueError, "cos_sin_cache width 5"),
    ("cache too wide", dict(cache=torch.randn(8, 20)), ValueError, "cos_sin_cache width 20"),
    ("cache device", dict(cache=torch.randn(8, 16, device="meta")), ValueError, "cos_sin_cache is on"),
    ("position too big", dict(positions=torch.tensor([0, 1, 8, 2])), ValueError,
     r"apply_rope_with_cos_sin_cache: positions\[2\] = 8 .*\[0, max_pos = 8\)"),
    ("position negative", dict(positions=torch.tensor([0, -1, 2, 2])), ValueError,
     r"positions\[1\] = -1"),
    ("positions length", dict(positions=torch.arange(3)), ValueError, "positions has 3"),
    ("head_size split", dict(head_size=12), ValueError, "head_size=12"),
    ("head_size zero", dict(head_size=0), ValueError, "head_size must be"),
    ("query 3-D head", dict(query=torch.randn(4, 4, 8).half()), ValueError, "query shape"),
    ("query rank", dict(query=torch.randn(4).half()), ValueError, "query must be"),
    ("key tokens", dict(key=torch.randn(3, 16).half()), ValueError, "key has 3 tokens"),
    ("is_neox type", dict(is_neox=None), TypeError, "is_neox"),
]


@pytest.mark.parametrize("name,kwargs,exc,match", BAD_CACHE, ids=[b[0] for b in BAD_CACHE])
def test_bad_cos_sin_cache_inputs(name, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        cache_call(**kwargs)


def test_unknown_backend():
    q, k, pos = good()
    with pytest.raises(ValueError, match="backend='nope'"):
        rope.apply_rope_pos_ids(q, k, pos, backend="nope")


# --------------------------------------------------------------------------------------------
# dispatch decisions on simulated devices


def problem(sm, dtype="float16", head_dim=128, features=()):
    shape = {"head_dim": head_dim, "rotary_dim": head_dim, "num_q_heads": 32, "num_k_heads": 8,
             "num_tokens": 1024}
    return Problem.make("rope", flashinfer.device.simulated(sm),
                        dtypes={"input": dtype, "pos": "int64"}, shape=shape, features=features)


ALL_FEATURES = ("interleave", "llama31", "partial_rotary", "cos_sin_cache", "inplace")


@pytest.mark.parametrize("sm", ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"])
@pytest.mark.parametrize("features", [(), ALL_FEATURES], ids=["plain", "all_features"])
def test_decision_per_sm(sm, features):
    decision = select(problem(sm, features=features), assume_installed=True)
    rejected = {c.backend: c.reasons for c in decision.rejected()}
    if sm == "cpu":
        assert decision.backend == "reference"
        assert [r.field for r in rejected["triton"]] == ["device"]
    else:
        assert decision.backend == "triton"
        assert decision.order == ("triton", "reference")
        assert not rejected
        assert "foundation_h200" in decision.basis


def test_decision_rejects_old_sm_and_unsupported_shapes():
    decision = select(problem("7.0"), assume_installed=True)
    assert decision.backend == "reference"
    rejected = {c.backend: c.reasons for c in decision.rejected()}
    assert [r.field for r in rejected["triton"]] == ["sm"]
    decision = select(problem("9.0", dtype="float64", head_dim=2048), assume_installed=True)
    fields = sorted(r.field for c in decision.rejected() if c.backend == "triton" for r in c.reasons)
    assert decision.backend == "reference" and fields == ["dtype.input", "head_dim"]


def test_public_call_builds_the_problem():
    q, k = make_qk(20, 4, 2, 64, torch.bfloat16)
    params = rope._params(q, 32, True, 1.0, 1e4, (1.0, 4.0, 8192))
    p = rope._problem(q, k, torch.arange(20, dtype=torch.int32), params, cached=False, inplace=True)
    assert p.features == {"interleave", "llama31", "partial_rotary", "inplace"}
    assert dict(p.dtypes) == {"input": "bfloat16", "pos": "int32"}
    assert dict(p.shape) == {"head_dim": 64, "rotary_dim": 32, "num_q_heads": 4, "num_k_heads": 2,
                             "num_tokens": 32}
    assert params.llama31 == Llama31Factors(1.0, 4.0, 8192.0)


def test_backend_argument_is_strict():
    q, k = make_qk(1, 1, 1, 2048, torch.float16)
    with pytest.raises(flashinfer.BackendUnavailableError, match="head_dim=2048"):
        rope.apply_rope_pos_ids(q, k, torch.zeros(1, dtype=torch.int32), backend="triton")
