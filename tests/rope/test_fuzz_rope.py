"""Fuzz suite, RoPE family: generated valid calls (tiny shapes, every variant, in place on views
of one packed qkv buffer) must match float64 naive math and write nothing outside q/k;
generated calls with one value wrong must raise a ValueError naming it (``rope_theta``,
``rope_scale``, the Llama 3.1 factors, a bad ``positions`` / ``indptr`` entry on the host, an
in-place ``q``/``k`` overlap) before anything is written; kernels given bad cache positions
(as on a GPU, where nothing is checked on the host) leave those tokens unrotated, read nothing
through them and record the fault for ``flashinfer.check_errors()``."""

from __future__ import annotations


import pytest
import torch
from hypothesis import given, strategies as st

import flashinfer
from flashinfer import rope
from flashinfer.dispatch import kernel_for
from flashinfer.dispatch import Problem
from flashinfer.rope import RopeParams

from conftest import FUZZ, HAS_CUDA, TOLERANCE, raises_naming, rope_oracle as oracle, usable_backends


SENTINEL = 12345.0
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
COMPUTED = ["apply_rope", "apply_rope_pos_ids", "apply_llama31_rope", "apply_llama31_rope_pos_ids"]
CACHED = "apply_rope_with_cos_sin_cache"


def _backends(device: str) -> list[str]:
    if device == "cuda" and not HAS_CUDA:
        return ["reference", "triton"]  # collected, then skipped by the gpu marker
    problem = Problem.make("rope", torch.device(device), dtypes={"input": torch.float16,
                                                              "pos": torch.int64},
                           shape={"head_dim": 8, "rotary_dim": 8, "num_q_heads": 2,
                                  "num_k_heads": 1, "num_tokens": 4},
                           features=("interleave", "llama31", "partial_rotary",
                                     "cos_sin_cache", "inplace"))
    return usable_backends(problem)


CPU_BACKENDS, GPU_BACKENDS = _backends("cpu"), _backends("cuda")


# --------------------------------------------------------------------------------------------
# helpers (the float64 oracle is conftest.rope_oracle)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype,
                   max_angle: float = 0.0) -> None:
    """Relative Frobenius error within the dtype's tolerance, plus the float32 angle's own
    error (the spec computes ``pos * f`` in float32: a few ulps of the largest angle)."""
    assert actual.dtype == dtype and not torch.isnan(actual).any()
    a, e = actual.double().cpu(), expected.double().cpu()
    tol = TOLERANCE[dtype] + max_angle * 2.0 ** -21
    if e.numel():
        err = float((a - e).norm() / e.norm().clamp_min(1e-30))
        assert err <= tol, f"relative error {err:.3g} > {tol:.3g}"


def max_angle(case) -> float:
    """The largest ``|pos| * f'_d`` of a computed-frequency case (``f'_d <= 1 / scale``, and
    Llama 3.1 keeps some frequencies unscaled: ``<= max(1, 1 / scale)``)."""
    if case["variant"] == CACHED or not case["pos"]:
        return 0.0
    return max(abs(p) for p in case["pos"]) * max(1.0, 1.0 / case["scale"])


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(bits(a), bits(b))


class Packed:
    """q and k as column blocks of one SENTINEL-padded ``[nnz + 2, width]`` buffer (vLLM's
    split of a fused qkv projection): ``q``/``k`` 3-D views, ``q2``/``k2`` their 2-D form."""

    def __init__(self, nnz, hq, hk, dim, dtype, device, g, gap: int = 3):
        width = (hq + hk) * dim + 2 * gap
        self.buf = torch.full((nnz + 2, width), SENTINEL, dtype=dtype, device=device)
        rows = slice(1, 1 + nnz)
        self.q2 = self.buf[rows, gap:gap + hq * dim]
        self.k2 = self.buf[rows, gap + hq * dim:gap + (hq + hk) * dim]
        self.q2.copy_(torch.randn(nnz, hq * dim, generator=g).to(dtype))
        self.k2.copy_(torch.randn(nnz, hk * dim, generator=g).to(dtype))
        self.q, self.k = self.q2.view(nnz, hq, dim), self.k2.view(nnz, hk, dim)
        mask = torch.ones(self.buf.shape, dtype=torch.bool)
        mask[rows, gap:gap + (hq + hk) * dim] = False
        self.mask = mask.to(device)
        self.around = self.buf[self.mask].clone()

    def untouched(self) -> bool:
        return same(self.buf[self.mask], self.around)


@st.composite
def rope_cases(draw):
    dim = draw(st.sampled_from([2, 4, 6, 8]))
    variant = draw(st.sampled_from(COMPUTED + [CACHED]))
    nnz = draw(st.integers(0, 4))
    case = {
        "variant": variant, "nnz": nnz, "hq": draw(st.integers(1, 2)),
        "hk": draw(st.integers(1, 2)),
        "dim": dim, "dtype": draw(st.sampled_from(DTYPES)), "inplace": draw(st.booleans()),
        "rotary_dim": draw(st.sampled_from([None] + list(range(2, dim + 1, 2)))),
        "interleave": draw(st.booleans()), "scale": draw(st.sampled_from([1.0, 0.5, 8.0])),
        "theta": draw(st.sampled_from([1e4, 5e5, 10.0])),
        "llama": draw(st.sampled_from([(1.0, 4.0, 64.0), (1.0, 4.0, 8192.0), (2.0, 3.0, 16.0)])),
        "index_dtype": draw(st.sampled_from([torch.int32, torch.int64])),
        "seed": draw(st.integers(0, 2**16)),
    }
    if variant == CACHED:
        case["max_pos"] = draw(st.integers(1, 8))
        case["pos"] = [draw(st.integers(0, case["max_pos"] - 1)) for _ in range(nnz)]
    elif "pos_ids" in variant:
        case["pos"] = [draw(st.integers(-50, 5000)) for _ in range(nnz)]
    else:
        cuts = sorted(draw(st.lists(st.integers(0, nnz), max_size=3)))
        case["indptr"] = [0] + cuts + [nnz]
        case["offsets"] = [draw(st.integers(-20, 3000)) for _ in range(len(cuts) + 1)]
        case["pos"] = [case["offsets"][i] + j for i in range(len(cuts) + 1)
                       for j in range(case["indptr"][i + 1] - case["indptr"][i])]
    return case


def call_case(case, backend: str, device: str, packed: Packed, cache=None):
    """Run ``case`` on ``packed``'s q/k; returns the rotated (q, k)."""
    fn = case["variant"] + ("_inplace" if case["inplace"] else "")
    idx = dict(dtype=case["index_dtype"], device=device)
    if case["variant"] == CACHED:
        out = getattr(rope, fn)(torch.tensor(case["pos"], **idx), packed.q2, packed.k2,
                                case["dim"], cache, not case["interleave"], backend=backend)
        q, k = (packed.q2, packed.k2) if case["inplace"] else out
        return q.view(packed.q.shape), k.view(packed.k.shape)
    if "pos_ids" in case["variant"]:
        lead = (torch.tensor(case["pos"], **idx),)
    else:
        lead = (torch.tensor(case["indptr"], **idx), torch.tensor(case["offsets"], **idx))
    kw = dict(rotary_dim=case["rotary_dim"], interleave=case["interleave"],
              rope_scale=case["scale"], rope_theta=case["theta"], backend=backend)
    if "llama31" in case["variant"]:
        kw.update(zip(("low_freq_factor", "high_freq_factor", "old_context_len"), case["llama"]))
    out = getattr(rope, fn)(packed.q, packed.k, *lead, **kw)
    return (packed.q, packed.k) if case["inplace"] else out


def run_valid_case(case, backend: str, device: str) -> None:
    g = torch.Generator().manual_seed(case["seed"])
    packed = Packed(case["nnz"], case["hq"], case["hk"], case["dim"], case["dtype"], device, g)
    q0, k0 = packed.q.clone(), packed.k.clone()
    cache = None
    rot = case["rotary_dim"] or case["dim"]
    if case["variant"] == CACHED:
        rot = case["rotary_dim"] or case["dim"]
        cache = torch.randn(case["max_pos"], rot, generator=g).to(device)
    q, k = call_case(case, backend, device, packed, cache)
    args = dict(scale=case["scale"], theta=case["theta"], cache=cache,
                llama=case["llama"] if "llama31" in case["variant"] else None)
    if case["variant"] == CACHED:
        args.update(scale=1.0, theta=1e4, llama=None)
    angle = max_angle(case)
    for got, before in ((q, q0), (k, k0)):
        want = oracle(before, case["pos"], rot, case["interleave"], **args)
        assert_matches(got, want, case["dtype"], angle)
    assert same(q[..., rot:], q0[..., rot:]) and same(k[..., rot:], k0[..., rot:])
    assert packed.untouched()
    if not case["inplace"]:
        assert same(packed.q, q0) and same(packed.k, k0)


# --------------------------------------------------------------------------------------------
# valid calls


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@FUZZ
@given(case=rope_cases())
def test_valid_calls_match_float64(backend, case):
    run_valid_case(case, backend, "cpu")
    flashinfer.check_errors()  # nothing recorded


# --------------------------------------------------------------------------------------------
# one value wrong: rejected before any kernel runs


BAD_NUMBERS = [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e-39, 1e39]


@FUZZ
@given(fn=st.sampled_from(COMPUTED), inplace=st.booleans(), data=st.data(),
       value=st.sampled_from(BAD_NUMBERS))
def test_bad_frequency_parameter_raises_naming_it(fn, inplace, data, value):
    names = ["rope_scale", "rope_theta"]
    if "llama31" in fn:
        names += ["low_freq_factor", "high_freq_factor", "old_context_len"]
    name = data.draw(st.sampled_from(names))
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    q0, k0 = q.clone(), k.clone()
    lead = (torch.arange(3),) if "pos_ids" in fn else (torch.tensor([0, 3]), torch.tensor([0]))
    with raises_naming(name):
        getattr(rope, fn + ("_inplace" if inplace else ""))(q, k, *lead, **{name: value})
    assert same(q, q0) and same(k, k0)


def test_llama31_factors_too_close_raise():
    q, k = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    with raises_naming("high_freq_factor", "low_freq_factor", "too close"):
        rope.apply_llama31_rope_pos_ids(q, k, torch.arange(2), low_freq_factor=1e-30,
                                        high_freq_factor=1.000001e-30)


@FUZZ
@given(nnz=st.integers(1, 5), max_pos=st.integers(1, 6), inplace=st.booleans(), data=st.data(),
       index_dtype=st.sampled_from([torch.int32, torch.int64]))
def test_bad_cache_position_on_the_host_raises_naming_it(nnz, max_pos, inplace, data, index_dtype):
    pos = [data.draw(st.integers(0, max_pos - 1)) for _ in range(nnz)]
    t = data.draw(st.integers(0, nnz - 1))
    pos[t] = data.draw(st.sampled_from([-1, -1000, max_pos, max_pos + 77, 2**31 - 1]))
    first = next(i for i, p in enumerate(pos) if not 0 <= p < max_pos)
    q, k = torch.randn(nnz, 16), torch.randn(nnz, 8)
    q0, k0 = q.clone(), k.clone()
    fn = CACHED + ("_inplace" if inplace else "")
    with raises_naming(fn + ":", f"positions[{first}] = {pos[first]}", f"max_pos = {max_pos}"):
        getattr(rope, fn)(torch.tensor(pos, dtype=index_dtype), q, k, 8, torch.randn(max_pos, 8))
    assert same(q, q0) and same(k, k0)


@FUZZ
@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=4), data=st.data(),
       kind=st.sampled_from(["start", "order", "end", "past"]), llama=st.booleans(),
       inplace=st.booleans())
def test_bad_indptr_on_the_host_raises_naming_it(counts, data, kind, llama, inplace):
    indptr = [0]
    for c in counts:
        indptr.append(indptr[-1] + c)
    nnz = indptr[-1]
    if kind == "start":
        indptr[0] = data.draw(st.sampled_from([-2, 1, 5]))
    elif kind == "order":
        if len(indptr) < 3:
            return
        i = data.draw(st.integers(1, len(indptr) - 2))
        indptr[i] = indptr[i + 1] + data.draw(st.integers(1, 3))
    elif kind == "end":
        indptr[-1] += data.draw(st.sampled_from([-1, 1, 4])) if nnz else 2
    else:
        indptr[data.draw(st.integers(1, len(indptr) - 1))] = nnz + data.draw(st.integers(1, 9))
    lower = [0] + indptr[:-1]
    lower[-1] = nnz
    upper = [0] + [nnz] * (len(indptr) - 1)
    bad = [i for i, v in enumerate(indptr) if not lower[i] <= v <= upper[i]]
    if not bad:
        return  # the mutation happened to keep a valid indptr
    q, k = torch.randn(nnz, 1, 4), torch.randn(nnz, 1, 4)
    q0, k0 = q.clone(), k.clone()
    fn = ("apply_llama31_rope" if llama else "apply_rope") + ("_inplace" if inplace else "")
    with raises_naming(fn + ":", f"indptr[{bad[0]}] = {indptr[bad[0]]}", f"nnz = {nnz}"):
        getattr(rope, fn)(q, k, torch.tensor(indptr), torch.zeros(len(counts), dtype=torch.int64))
    assert same(q, q0) and same(k, k0)


@FUZZ
@given(kind=st.sampled_from(["k_is_q", "k_shifted", "k_inside_q", "q_expanded",
                             "cache_in_query", "cache_in_key"]),
       nnz=st.integers(2, 4), fn=st.sampled_from(COMPUTED))
def test_inplace_overlap_raises_naming_both(kind, nnz, fn):
    buf = torch.randn(nnz + 1, 2, 8)
    before = buf.clone()
    q = buf[:nnz]
    k = {"k_is_q": q, "k_shifted": buf[1:], "k_inside_q": buf[:nnz, 1:]}.get(
        kind, torch.randn(nnz, 1, 8))
    if kind.startswith("cache"):
        flat = buf.view(nnz + 1, 16)
        query, key = flat[:nnz, :8], flat[:nnz, 8:]
        target = "query" if kind == "cache_in_query" else "key"
        cache = (flat[0, :8] if target == "query" else flat[0, 8:]).view(1, 8)  # a row of it
        with raises_naming(CACHED + "_inplace", target, "cos_sin_cache"):
            rope.apply_rope_with_cos_sin_cache_inplace(torch.zeros(nnz, dtype=torch.int64),
                                                       query, key, 8, cache)
        assert same(buf, before)
        return
    if kind == "q_expanded":
        q = buf[:1].expand(nnz, 2, 8)
    lead = (torch.arange(nnz),) if "pos_ids" in fn else (torch.tensor([0, nnz]), torch.tensor([0]))
    words = ("q", "stride 0") if kind == "q_expanded" else ("q shares memory with k",)
    with raises_naming(fn + "_inplace:", *words):
        getattr(rope, fn + "_inplace")(q, k, *lead)
    assert same(buf, before)


def test_disjoint_views_of_one_buffer_are_allowed():
    """vLLM's in-place call on the query / key column blocks of one qkv buffer."""
    g = torch.Generator().manual_seed(3)
    packed = Packed(3, 2, 1, 8, torch.float32, "cpu", g, gap=0)
    q0, k0 = packed.q.clone(), packed.k.clone()
    cache = torch.randn(5, 8, generator=g)
    pos = [4, 0, 2]
    rope.apply_rope_with_cos_sin_cache_inplace(torch.tensor(pos), packed.q2, packed.k2, 8, cache)
    assert_matches(packed.q, oracle(q0, pos, 8, False, cache=cache), torch.float32)
    assert_matches(packed.k, oracle(k0, pos, 8, False, cache=cache), torch.float32)
    assert packed.untouched()


# --------------------------------------------------------------------------------------------
# the kernels themselves, given bad cache positions (what a GPU call passes them)


@st.composite
def bad_position_cases(draw):
    nnz, max_pos = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    pos = [draw(st.integers(0, max_pos - 1)) for _ in range(nnz)]
    for t in draw(st.lists(st.integers(0, nnz - 1), min_size=1, max_size=nnz, unique=True)):
        pos[t] = draw(st.sampled_from([-1, -7, max_pos, max_pos + 3, 2**31 - 1]))
    return {"pos": pos, "max_pos": max_pos, "dim": draw(st.sampled_from([4, 8])),
            "rotary_dim": draw(st.sampled_from([2, 4])), "interleave": draw(st.booleans()),
            "inplace": draw(st.booleans()), "dtype": draw(st.sampled_from(DTYPES)),
            "seed": draw(st.integers(0, 2**16))}


def run_kernel_with_bad_positions(case, backend: str, device: str) -> None:
    g = torch.Generator().manual_seed(case["seed"])
    nnz, dim, rot, dtype = len(case["pos"]), case["dim"], case["rotary_dim"], case["dtype"]
    q = torch.randn(nnz, 2, dim, generator=g).to(dtype).to(device)
    k = torch.randn(nnz, 1, dim, generator=g).to(dtype).to(device)
    q0, k0 = q.clone(), k.clone()
    cache = torch.randn(case["max_pos"], rot, generator=g).to(device)
    if case["inplace"]:
        q_out, k_out = q, k
    else:  # poisoned: an element the kernel leaves unwritten fails
        q_out = torch.full_like(q, float("nan"))
        k_out = torch.full_like(k, float("nan"))
    pos = torch.tensor(case["pos"], device=device)
    fault = rope.POSITIONS_FAULTS[CACHED + ("_inplace" if case["inplace"] else "")]
    kernel_for(backend, "rope", "default")(
        q, k, q_out, k_out, pos, RopeParams(rot, case["interleave"], positions_fault=fault), cache)
    good = [t for t, p in enumerate(case["pos"]) if 0 <= p < case["max_pos"]]
    bad = [t for t in range(nnz) if t not in good]
    assert same(q_out[bad], q0[bad]) and same(k_out[bad], k0[bad])  # unrotated, bit for bit
    if good:
        gp = [case["pos"][t] for t in good]
        for out, before in ((q_out, q0), (k_out, k0)):
            want = oracle(before[good], gp, rot, case["interleave"], cache=cache)
            assert_matches(out[good], want, dtype)
    with raises_naming(fault.function + ":", f"positions[{bad[0]}] = {case['pos'][bad[0]]}",
                       f"max_pos = {case['max_pos']}", "skipped"):
        flashinfer.check_errors()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@FUZZ
@given(case=bad_position_cases())
def test_kernel_skips_bad_cache_positions_and_records_them(backend, case):
    run_kernel_with_bad_positions(case, backend, "cpu")


# --------------------------------------------------------------------------------------------
# GPU: the index arrays on the device, every backend usable there


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@FUZZ
@given(case=rope_cases())
def test_gpu_valid_calls_match_float64(backend, case):
    run_valid_case(case, backend, "cuda")
    flashinfer.check_errors()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@FUZZ
@given(case=bad_position_cases())
def test_gpu_kernel_skips_bad_cache_positions_and_records_them(backend, case):
    run_kernel_with_bad_positions(case, backend, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@FUZZ
@given(case=bad_position_cases())
def test_gpu_bad_cache_positions_are_skipped_recorded_and_raised_later(backend, case):
    g = torch.Generator().manual_seed(case["seed"])
    nnz, dim, rot = len(case["pos"]), case["dim"], case["rotary_dim"]
    query = torch.randn(nnz, 2 * dim, generator=g).to(case["dtype"]).cuda()
    key = torch.randn(nnz, dim, generator=g).to(case["dtype"]).cuda()
    q0, k0 = query.clone(), key.clone()
    cache = torch.randn(case["max_pos"], rot, generator=g).cuda()
    pos = torch.tensor(case["pos"], device="cuda")
    fn = CACHED + ("_inplace" if case["inplace"] else "")
    out = getattr(rope, fn)(pos, query, key, dim, cache, not case["interleave"], backend=backend)
    q, k = (query, key) if case["inplace"] else out  # no exception, no synchronisation here
    bad = [t for t, p in enumerate(case["pos"]) if not 0 <= p < case["max_pos"]]
    with raises_naming(fn + ":", f"positions[{bad[0]}] = {case['pos'][bad[0]]}"):
        flashinfer.check_errors()
    assert same(q[bad], q0[bad]) and same(k[bad], k0[bad])
    good = [t for t in range(nnz) if t not in bad]
    if good:
        gp = [case["pos"][t] for t in good]
        want = oracle(q0[good].view(len(good), 2, dim), gp, rot, case["interleave"], cache=cache)
        assert_matches(q[good].view(len(good), 2, dim), want, case["dtype"])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@FUZZ
@given(case=bad_position_cases())
def test_gpu_check_indices_env_raises_at_the_call(backend, case, monkeypatch):
    monkeypatch.setenv("FLASHINFER_CHECK_INDICES", "1")
    nnz, dim = len(case["pos"]), case["dim"]
    query = torch.randn(nnz, 2 * dim, device="cuda").to(case["dtype"])
    key = torch.randn(nnz, dim, device="cuda").to(case["dtype"])
    q0, k0 = query.clone(), key.clone()
    cache = torch.randn(case["max_pos"], case["rotary_dim"], device="cuda")
    bad = [t for t, p in enumerate(case["pos"]) if not 0 <= p < case["max_pos"]]
    fn = CACHED + ("_inplace" if case["inplace"] else "")
    with raises_naming(fn + ":", f"positions[{bad[0]}] = {case['pos'][bad[0]]}"):
        getattr(rope, fn)(torch.tensor(case["pos"], device="cuda"), query, key, dim, cache,
                          backend=backend)
    assert same(query, q0) and same(key, k0)
    flashinfer.check_errors()  # raised at the call, nothing left in the record


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("indptr", [[1, 2, 4], [0, 3, 2, 4], [0, 2, 3], [0, 9, 4]])
def test_gpu_bad_indptr_rotates_nothing_and_is_recorded(backend, indptr):
    q, k = torch.randn(4, 2, 8, device="cuda"), torch.randn(4, 1, 8, device="cuda")
    offsets = torch.full((len(indptr) - 1,), 5, device="cuda")
    q_rope, k_rope = rope.apply_rope(q, k, torch.tensor(indptr, device="cuda"), offsets,
                                     backend=backend)
    assert_matches(q_rope, q, torch.float32)  # every token at position 0: angle 0
    assert_matches(k_rope, k, torch.float32)
    with raises_naming("apply_rope:", "indptr[", "nnz = 4"):
        flashinfer.check_errors()
