"""RoPE family (flashinfer.rope): math vs a float64 oracle, Triton vs reference, the API
surface, torch.compile, and GPU checks (validation and decisions: test_rope_validation.py)."""

import inspect

import pytest
import torch

import flashinfer
from flashinfer import rope
from flashinfer.dispatch import kernel_for
from flashinfer.capability_db import database
from flashinfer.rope import RopeParams

from conftest import TOLERANCE, poison, rel_error, rope_oracle as oracle

LLAMA_DEFAULT = (1.0, 4.0, 8192)
LLAMA_SHORT = (1.0, 4.0, 64)  # smoothing band at high frequencies, so small positions see it


# --------------------------------------------------------------------------------------------
# helpers (the float64 oracle is conftest.rope_oracle)


def ragged_positions(indptr, offsets):
    pos = []
    for i in range(len(offsets)):
        pos += [int(offsets[i]) + j for j in range(int(indptr[i + 1] - indptr[i]))]
    return torch.tensor(pos, dtype=torch.int64)


def make_qk(nnz, hq, hk, d, dtype, device="cpu"):
    return (torch.randn(nnz, hq, d, dtype=dtype, device=device),
            torch.randn(nnz, hk, d, dtype=dtype, device=device))


def cos_sin_cache(max_pos, rotary_dim, theta=1e4, device="cpu"):
    inv = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((ang.cos(), ang.sin()), -1).float().to(device)


def check(actual, expected, dtype):
    assert actual.dtype == dtype
    err = rel_error(actual, expected)
    assert err <= TOLERANCE[dtype], f"relative error {err:.3g} > {TOLERANCE[dtype]}"


def call(fn_name, q, k, pos=None, indptr=None, offsets=None, **kw):
    """Run one of the eight computed-frequency functions; returns (q_out, k_out)."""
    fn = getattr(rope, fn_name)
    lead = (indptr, offsets) if "pos_ids" not in fn_name else (pos,)
    if fn_name.endswith("_inplace"):
        q, k = q.clone(), k.clone()
        assert fn(q, k, *lead, **kw) is None
        return q, k
    return fn(q, k, *lead, **kw)


COMPUTED = ["apply_rope", "apply_rope_inplace", "apply_rope_pos_ids", "apply_rope_pos_ids_inplace",
            "apply_llama31_rope", "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids",
            "apply_llama31_rope_pos_ids_inplace"]


# --------------------------------------------------------------------------------------------
# reference vs oracle


@pytest.mark.parametrize("fn_name", COMPUTED)
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_computed_variants_match_oracle(fn_name, interleave, rotary_dim, dtype):
    torch.manual_seed(1)
    indptr = torch.tensor([0, 3, 3, 7, 9], dtype=torch.int32)
    offsets = torch.tensor([5, 0, 41, 2], dtype=torch.int32)
    pos = ragged_positions(indptr, offsets)
    q, k = make_qk(9, 4, 2, 32, dtype)
    llama = "llama31" in fn_name
    kw = dict(rotary_dim=rotary_dim, interleave=interleave, backend="reference")
    if llama:
        kw.update(rope_scale=4.0, rope_theta=5e5, low_freq_factor=LLAMA_SHORT[0],
                  high_freq_factor=LLAMA_SHORT[1], old_context_len=LLAMA_SHORT[2])
    q_out, k_out = call(fn_name, q, k, pos=pos, indptr=indptr, offsets=offsets, **kw)
    rot = rotary_dim or 32
    args = dict(scale=4.0, theta=5e5, llama=LLAMA_SHORT) if llama else {}
    check(q_out, oracle(q, pos, rot, interleave, **args), dtype)
    check(k_out, oracle(k, pos, rot, interleave, **args), dtype)
    if rotary_dim:  # pass-through dims are copied bit for bit
        assert torch.equal(q_out[..., rot:], q[..., rot:])


@pytest.mark.parametrize("llama", [None, LLAMA_DEFAULT])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_long_context_positions(llama, dtype):
    """Positions up to 128k (fp32 angle rounding stays far below half-precision tolerance)."""
    torch.manual_seed(2)
    q, k = make_qk(16, 2, 1, 128, dtype)
    pos = torch.randint(0, 131072, (16,), dtype=torch.int64)
    if llama is None:
        out = rope.apply_rope_pos_ids(q, k, pos, rope_theta=5e5, backend="reference")
        check(out[0], oracle(q, pos, 128, False, theta=5e5), dtype)
    else:
        out = rope.apply_llama31_rope_pos_ids(q, k, pos, backend="reference")
        check(out[0], oracle(q, pos, 128, False, scale=8.0, theta=5e5, llama=llama), dtype)


def test_llama31_defaults_and_smoothing_matter():
    torch.manual_seed(3)
    q, k = make_qk(8, 2, 2, 64, torch.float32)
    pos = torch.randint(0, 64, (8,))
    out = rope.apply_llama31_rope_pos_ids(q, k, pos, rotary_dim=32, low_freq_factor=1.0,
                                          high_freq_factor=4.0, old_context_len=64)
    check(out[1], oracle(k, pos, 32, False, scale=8.0, theta=5e5, llama=LLAMA_SHORT), torch.float32)
    plain = rope.apply_rope_pos_ids(q, k, pos, rotary_dim=32, rope_scale=8.0, rope_theta=5e5)
    assert rel_error(plain[1], out[1]) > 1e-3  # the smoothing changes the result


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [32, 16])
@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cos_sin_cache_variants_match_oracle(is_neox, rotary_dim, three_d, dtype):
    torch.manual_seed(4)
    nnz, hq, hk, hs = 7, 4, 2, 32
    q, k = make_qk(nnz, hq, hk, hs, dtype)
    cache = torch.randn(50, rotary_dim)  # any float32 table: the kernel only looks values up
    pos = torch.randint(0, 50, (nnz,), dtype=torch.int32)
    query, key = (q, k) if three_d else (q.reshape(nnz, -1), k.reshape(nnz, -1))
    expect_q = oracle(q, pos, rotary_dim, not is_neox, cache=cache).reshape(query.shape)
    expect_k = oracle(k, pos, rotary_dim, not is_neox, cache=cache).reshape(key.shape)
    out_q, out_k = rope.apply_rope_with_cos_sin_cache(pos, query, key, hs, cache, is_neox=is_neox,
                                                      backend="reference")
    check(out_q, expect_q, dtype)
    check(out_k, expect_k, dtype)
    query2, key2 = query.clone(), key.clone()
    assert rope.apply_rope_with_cos_sin_cache_inplace(pos, query2, key2, hs, cache, is_neox,
                                                      backend="reference") is None
    assert torch.equal(query2, out_q) and torch.equal(key2, out_k)


def test_cos_sin_cache_equals_computed_rope():
    torch.manual_seed(5)
    q, k = make_qk(6, 2, 2, 64, torch.float32)
    pos = torch.randint(0, 40, (6,))
    expect = rope.apply_rope_pos_ids(q, k, pos, rotary_dim=32, backend="reference")
    got = rope.apply_rope_with_cos_sin_cache(pos, q.reshape(6, -1), k.reshape(6, -1), 64,
                                             cos_sin_cache(40, 32), backend="reference")
    check(got[0].view(6, 2, 64), expect[0].double(), torch.float32)


def test_out_of_place_leaves_inputs_and_inplace_matches():
    torch.manual_seed(6)
    q, k = make_qk(5, 3, 1, 16, torch.float16)
    q0, k0, pos = q.clone(), k.clone(), torch.arange(5)
    q_rope, k_rope = rope.apply_rope_pos_ids(q, k, pos)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    assert q_rope.data_ptr() != q.data_ptr()
    rope.apply_rope_pos_ids_inplace(q, k, pos)
    assert torch.equal(q, q_rope) and torch.equal(k, k_rope)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_strided_views_of_packed_qkv(backend):
    """q and k as head slices of one packed [nnz, (Hq + 2 Hk) * D] buffer, as engines pass them."""
    torch.manual_seed(7)
    nnz, hq, hk, d = 4, 2, 1, 16
    qkv = torch.randn(nnz, (hq + 2 * hk) * d)
    q = qkv[:, : hq * d].view(nnz, hq, d)
    k = qkv[:, hq * d: (hq + hk) * d].view(nnz, hk, d)
    v_before = qkv[:, (hq + hk) * d:].clone()
    pos = torch.tensor([3, 1, 4, 1])
    expect_q, expect_k = oracle(q, pos, 8, True), oracle(k, pos, 8, True)
    q_rope, k_rope = rope.apply_rope_pos_ids(q, k, pos, 8, True, backend=backend)
    check(q_rope, expect_q, torch.float32)
    rope.apply_rope_pos_ids_inplace(q, k, pos, 8, True, backend=backend)
    check(q, expect_q, torch.float32)
    check(k, expect_k, torch.float32)
    assert torch.equal(qkv[:, (hq + hk) * d:], v_before)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_any_strides_including_the_head_dim(backend):
    """Transposed buffers: the last dim is not contiguous (stride 4 / 2), outputs still right."""
    torch.manual_seed(15)
    query, key = torch.randn(16, 4).t(), torch.randn(8, 4).t()  # [4, 16], [4, 8]
    cache, pos = torch.randn(10, 8), torch.tensor([9, 0, 3, 3])
    out_q, out_k = rope.apply_rope_with_cos_sin_cache(pos, query, key, 8, cache, False,
                                                      backend=backend)
    check(out_q, oracle(query.view(4, 2, 8), pos, 8, True, cache=cache).view(4, 16), torch.float32)
    check(out_k, oracle(key.view(4, 1, 8), pos, 8, True, cache=cache).view(4, 8), torch.float32)


def test_negative_positions_follow_the_formula():
    torch.manual_seed(8)
    q, k = make_qk(3, 1, 1, 8, torch.float32)
    pos = torch.tensor([-5, 0, 7])
    check(rope.apply_rope_pos_ids(q, k, pos)[0], oracle(q, pos, 8, False), torch.float32)


def test_empty_batch():
    q, k = make_qk(0, 2, 1, 16, torch.float16)
    for backend in ("reference", "triton"):
        q_rope, k_rope = rope.apply_rope_pos_ids(q, k, torch.zeros(0, dtype=torch.int32),
                                                 backend=backend)
        assert q_rope.shape == q.shape and k_rope.shape == k.shape


def test_segment_positions_outside_segments_are_zero():
    """The sync-free GPU path: tokens before indptr[0] or after indptr[-1] get position 0."""
    indptr = torch.tensor([1, 3, 3, 5])
    offsets = torch.tensor([10, 20, 30])
    pos = rope._segment_positions(indptr, offsets, 7)
    assert pos.tolist() == [0, 10, 11, 30, 31, 0, 0]


# --------------------------------------------------------------------------------------------
# Triton (interpreter on CPU) vs reference


TRITON_CASES = [
    # name, rotary_dim, interleave, llama31, cache
    ("plain", None, False, None, False),
    ("interleave", None, True, None, False),
    ("partial", 10, False, None, False),
    ("partial_interleave", 6, True, None, False),
    ("llama31", None, False, LLAMA_SHORT, False),
    ("llama31_partial_interleave", 8, True, LLAMA_SHORT, False),
    ("cache_neox", 16, False, None, True),
    ("cache_interleave_partial", 6, True, None, True),
]


def run_case(backend, q, k, pos, rotary_dim, interleave, llama, cache, inplace):
    if inplace:
        q, k = q.clone(), k.clone()
    if cache is not None:
        fn = (rope.apply_rope_with_cos_sin_cache_inplace if inplace
              else rope.apply_rope_with_cos_sin_cache)
        out = fn(pos, q, k, q.shape[-1], cache, not interleave, backend=backend)
    elif llama is not None:
        fn = rope.apply_llama31_rope_pos_ids_inplace if inplace else rope.apply_llama31_rope_pos_ids
        out = fn(q, k, pos, rotary_dim, interleave, 2.0, 1e4, *llama, backend=backend)
    else:
        fn = rope.apply_rope_pos_ids_inplace if inplace else rope.apply_rope_pos_ids
        out = fn(q, k, pos, rotary_dim, interleave, 2.0, 500.0, backend=backend)
    return (q, k) if inplace else out


@pytest.mark.parametrize("name,rotary_dim,interleave,llama,use_cache", TRITON_CASES,
                         ids=[c[0] for c in TRITON_CASES])
@pytest.mark.parametrize("inplace", [False, True])
def test_triton_matches_reference(name, rotary_dim, interleave, llama, use_cache, inplace):
    torch.manual_seed(9)
    q, k = make_qk(3, 3, 2, 16, torch.float32)
    pos = torch.tensor([0, 17, 5], dtype=torch.int32)
    cache = torch.randn(20, rotary_dim) if use_cache else None
    expect = run_case("reference", q, k, pos, rotary_dim, interleave, llama, cache, inplace)
    got = run_case("triton", q, k, pos, rotary_dim, interleave, llama, cache, inplace)
    for g, e in zip(got, expect):
        check(g, e, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_half_precision_ragged(dtype):
    torch.manual_seed(10)
    q, k = make_qk(5, 2, 1, 32, dtype)
    indptr, offsets = torch.tensor([0, 2, 5]), torch.tensor([7, 100])
    expect = rope.apply_rope(q, k, indptr, offsets, rotary_dim=16, backend="reference")
    got = rope.apply_rope(q, k, indptr, offsets, rotary_dim=16, backend="triton")
    for g, e in zip(got, expect):
        check(g, e, dtype)
        assert torch.equal(g[..., 16:], e[..., 16:])


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_kernels_never_read_outside_the_cache(backend):
    """Kernel contract for GPU calls (no host check): a token whose cache position is out of
    range is left unrotated, the cache is not read for it, and the fault is recorded."""
    torch.manual_seed(11)
    q, k = make_qk(3, 1, 1, 8, torch.float32)
    q_out, k_out = poison(torch.empty_like(q)), poison(torch.empty_like(k))
    pos = torch.tensor([-1, 2, 4])
    cache = torch.randn(4, 4)
    kernel = kernel_for(backend, "rope", "default")
    fault = rope.POSITIONS_FAULTS["apply_rope_with_cos_sin_cache"]
    kernel(q, k, q_out, k_out, pos, RopeParams(4, False, positions_fault=fault), cache)
    assert torch.equal(q_out[[0, 2]], q[[0, 2]]) and torch.equal(k_out[[0, 2]], k[[0, 2]])
    assert torch.equal(q_out[..., 4:], q[..., 4:])
    check(q_out[1:2], oracle(q[1:2], pos[1:2], 4, False, cache=cache), torch.float32)
    with pytest.raises(ValueError, match=r"positions\[0\] = -1 .*2 bad entries"):
        flashinfer.check_errors()


def test_use_backend_context():
    torch.manual_seed(16)
    q, k = make_qk(4, 2, 1, 16, torch.float16)
    pos = torch.arange(4)
    with flashinfer.use_backend(rope="triton"):
        out = rope.apply_rope_pos_ids(q, k, pos)
    check(out[0], oracle(q, pos, 16, False), torch.float16)


# --------------------------------------------------------------------------------------------
# API surface and torch.compile


UPSTREAM_SIGNATURES = {
    "apply_rope": "q k indptr offsets rotary_dim=None interleave=False rope_scale=1 rope_theta=10000",
    "apply_rope_pos_ids": "q k pos_ids rotary_dim=None interleave=False rope_scale=1 rope_theta=10000",
    "apply_llama31_rope": "q k indptr offsets rotary_dim=None interleave=False rope_scale=8 "
                          "rope_theta=500000 low_freq_factor=1 high_freq_factor=4 old_context_len=8192",
    "apply_llama31_rope_pos_ids": "q k pos_ids rotary_dim=None interleave=False rope_scale=8 "
                                  "rope_theta=500000 low_freq_factor=1 high_freq_factor=4 "
                                  "old_context_len=8192",
    "apply_rope_with_cos_sin_cache": "positions query key head_size cos_sin_cache is_neox=True",
}


def spelled(fn):
    parts = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "backend":
            assert p.default == "auto"
            continue
        if p.default is inspect.Parameter.empty:
            parts.append(p.name)
        else:
            value = int(p.default) if isinstance(p.default, float) else p.default
            parts.append(f"{p.name}={value}")
    return " ".join(parts)


@pytest.mark.parametrize("name", sorted(UPSTREAM_SIGNATURES))
def test_signatures_match_upstream(name):
    assert spelled(getattr(rope, name)) == UPSTREAM_SIGNATURES[name]
    assert spelled(getattr(rope, name + "_inplace")) == UPSTREAM_SIGNATURES[name]
    assert hasattr(torch.ops.flashinfer, name) and hasattr(torch.ops.flashinfer, name + "_inplace")


def test_torch_compile_out_of_place():
    torch.manual_seed(12)
    q, k = make_qk(6, 2, 2, 32, torch.float32)
    pos = torch.randint(0, 50, (6,))

    def f(q, k, pos):
        q_rope, k_rope = rope.apply_llama31_rope_pos_ids(q, k, pos, rotary_dim=16, interleave=True)
        return q_rope * 2, k_rope

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(q, k, pos), f(q, k, pos)):
        assert torch.equal(a, b)


def test_torch_compile_inplace():
    """vLLM's use: in-place cache RoPE on query/key views split from one packed qkv buffer."""
    torch.manual_seed(13)
    qkv = torch.randn(6, 4 * 32)
    cache = torch.randn(50, 32)
    pos = torch.randint(0, 50, (6,))

    def f(qkv, pos):
        query, key, value = qkv.split([64, 32, 32], dim=-1)
        rope.apply_rope_with_cos_sin_cache_inplace(pos, query, key, 32, cache, is_neox=True)
        return query * 2, key, value

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    a, b = qkv.clone(), qkv.clone()
    for x, y in zip(compiled(a, pos), f(b, pos)):
        assert torch.equal(x, y)
    assert torch.equal(a, b) and not torch.equal(a, qkv)


# --------------------------------------------------------------------------------------------
# GPU: every backend that serves "rope" vs the reference


GPU_BACKENDS = sorted({r.backend for r in database().for_op("rope")} - {"reference"})


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("nnz,hq,hk,d", [(1, 32, 8, 128), (7, 4, 4, 64), (1024, 32, 8, 128)])
@pytest.mark.parametrize("name,rotary_dim,interleave,llama,use_cache", TRITON_CASES,
                         ids=[c[0] for c in TRITON_CASES])
@pytest.mark.parametrize("inplace", [False, True])
def test_gpu_backend_matches_reference(backend, dtype, nnz, hq, hk, d, name, rotary_dim, interleave,
                                       llama, use_cache, inplace):
    torch.manual_seed(14)
    q, k = make_qk(nnz, hq, hk, d, dtype, "cuda")
    rot = min(rotary_dim or d, d)
    pos = torch.randint(0, 32768, (nnz,), device="cuda")
    cache = cos_sin_cache(32768, rot, device="cuda") if use_cache else None
    expect = run_case("reference", q, k, pos, rot, interleave, llama, cache, inplace)
    got = run_case(backend, q, k, pos, rot, interleave, llama, cache, inplace)
    for g, e in zip(got, expect):
        check(g, e, dtype)


@pytest.mark.gpu
def test_gpu_out_of_range_cache_positions_are_skipped_and_recorded():
    q, k = make_qk(4, 2, 1, 64, torch.float16, "cuda")
    pos = torch.tensor([0, 5, 100, -3], device="cuda")
    out = rope.apply_rope_with_cos_sin_cache(pos, q, k, 64, cos_sin_cache(16, 64, device="cuda"))
    assert torch.equal(out[0][2:], q[2:]) and not torch.equal(out[0][1], q[1])
    with pytest.raises(ValueError, match=r"positions\[2\] = 100"):
        flashinfer.check_errors()
