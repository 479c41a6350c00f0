"""Fuzz suite, norm and activation families: generated valid calls (tiny shapes, random
strides, NaN weights, ``out=input``) must match float64 naive math and write nothing outside
their outputs; generated calls with one value wrong (``eps``, an aliased ``out`` / ``residual``
/ ``weight``) must raise a ValueError naming the argument before anything is written.

CPU: every backend that serves the op here (reference; Triton in its interpreter, both the
single-pass and the looped RMSNorm kernel). GPU (marker ``gpu``): the same generated calls
over every backend usable on the device."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

from flashinfer import activation as fact
from flashinfer import norm as fnorm
from flashinfer.backends.triton import norm as triton_norm
from flashinfer.dispatch import Problem

from conftest import FUZZ, HAS_CUDA, TOLERANCE, raises_naming, usable_backends

SENTINEL = 12345.0  # what the memory around an output holds; a stray write changes it
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _backends(op: str, device: str, features=()) -> list[str]:
    if device == "cuda" and not HAS_CUDA:
        return ["reference", "triton"]  # collected, then skipped by the gpu marker
    problem = Problem.make(op, torch.device(device), dtypes={"input": torch.float32,
                                                              "weight": torch.float32},
                           shape={"hidden_size": 16, "num_rows": 4}, features=features)
    return usable_backends(problem)


NORM_CPU = _backends("rmsnorm", "cpu", ("fused_add", "gemma_weight", "per_head"))
NORM_GPU = _backends("rmsnorm", "cuda", ("fused_add", "gemma_weight", "per_head"))
LN_CPU, LN_GPU = _backends("layernorm", "cpu"), _backends("layernorm", "cuda")
ACT_CPU = _backends("act_and_mul", "cpu", ("silu",))
ACT_GPU = _backends("act_and_mul", "cuda", ("silu",))


# --------------------------------------------------------------------------------------------
# helpers


def embedded(shape, dtype, device, g: torch.Generator, pad: int = 2
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(buffer, view)``: a strided ``shape`` view in the middle of a SENTINEL-filled buffer
    (``pad`` elements on every side of every dim), so writes outside the view show."""
    big = torch.full([n + 2 * pad for n in shape], SENTINEL, dtype=dtype, device=device)
    view = big[tuple(slice(pad, pad + n) for n in shape)]
    view.copy_(torch.randn(shape, generator=g).to(dtype))
    return big, view


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns (NaN compares equal to the same NaN)."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                                8: torch.int64}[t.element_size()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(bits(a), bits(b))


def outside(big: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The elements of ``big`` not covered by ``view`` (a copy)."""
    keep = torch.ones_like(big, dtype=torch.bool)
    offset = view.storage_offset() - big.storage_offset()
    mask_view = keep.as_strided(view.shape, big.stride(), offset)
    mask_view.fill_(False)
    return big[keep]


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """NaN and inf exactly where float64 math has them; the finite rest within the dtype's
    relative Frobenius tolerance (DESIGN.md)."""
    exp = expected.to(dtype).double()  # the oracle rounded once, as the kernels round
    act = actual.double()
    assert torch.equal(torch.isnan(act), torch.isnan(exp)), "NaN pattern differs"
    finite = torch.isfinite(exp)
    assert torch.equal(act[~finite & ~torch.isnan(exp)], exp[~finite & ~torch.isnan(exp)])
    a, e = act[finite], expected.double()[finite]
    if e.numel():
        err = float((a - e).norm() / e.norm().clamp_min(1e-30))
        assert err <= TOLERANCE[dtype], f"relative error {err:.3g} > {TOLERANCE[dtype]}"


def oracle_rmsnorm(v: torch.Tensor, w: torch.Tensor, eps: float, bias: float) -> torch.Tensor:
    v = v.double()
    return v / torch.sqrt(v.square().mean(-1, keepdim=True) + eps) * (w.double() + bias)


def with_paths(backends: list[str]) -> list[tuple[str, str]]:
    """``(backend, path)``: every backend once, Triton also with its looped RMSNorm/LayerNorm
    kernel (forced on tiny rows by shrinking the thresholds, see ``use_path``)."""
    return [(b, "single") for b in backends] + [("triton", "looped")] * ("triton" in backends)


def use_path(path: str, monkeypatch) -> None:
    if path == "looped":
        monkeypatch.setattr(triton_norm, "MAX_SINGLE_BLOCK", 4)
        monkeypatch.setattr(triton_norm, "LOOP_BLOCK", 4)


@st.composite
def norm_cases(draw):
    per_head = draw(st.booleans())
    shape = (draw(st.integers(0, 3)),) + ((draw(st.integers(1, 2)),) if per_head else ()) \
        + (draw(st.integers(1, 11)),)
    return {
        "shape": shape, "dtype": draw(st.sampled_from(DTYPES)),
        "fn": draw(st.sampled_from(["rmsnorm", "gemma_rmsnorm", "fused_add_rmsnorm",
                                    "gemma_fused_add_rmsnorm"])),
        "out": draw(st.sampled_from(["none", "separate", "input"])),
        "eps": draw(st.sampled_from([0.0, 1e-6, 1e-2, 3.0])),
        "nan_weight": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def run_norm_case(case, backend: str, device: str) -> None:
    g = torch.Generator().manual_seed(case["seed"])
    shape, dtype, fn = case["shape"], case["dtype"], case["fn"]
    big_x, x = embedded(shape, dtype, device, g)
    w = (torch.randn(shape[-1], generator=g) + 1).to(dtype).to(device)
    if case["nan_weight"]:
        w[torch.randint(0, shape[-1], (1,), generator=g).item()] = float("nan")
    bias = 1.0 if fn.startswith("gemma") else 0.0
    x0 = x.clone()
    if "fused" in fn:
        big_r, r = embedded(shape, dtype, device, g)
        r0 = r.clone()
        around_x, around_r = outside(big_x, x), outside(big_r, r)
        getattr(fnorm, fn)(x, r, w, case["eps"], backend=backend)
        # the stored sum: fp32 sum rounded to the dtype (the interpreter's bf16 rounding may
        # differ by an ulp), then the normalisation of exactly what was stored
        assert_matches(r, x0.double() + r0.double(), dtype)
        assert_matches(x, oracle_rmsnorm(r, w, case["eps"], bias), dtype)
        assert same(outside(big_x, x), around_x) and same(outside(big_r, r), around_r)
        return
    if case["out"] == "input":
        out, big_o = x, big_x
    elif case["out"] == "separate":
        big_o, out = embedded(shape, dtype, device, g)
        out.fill_(float("nan"))  # poisoned: an unwritten element fails
    else:
        out = big_o = None
    around_o = outside(big_o, out) if out is not None else None
    around_x = outside(big_x, x)
    got = getattr(fnorm, fn)(x, w, case["eps"], out, backend=backend)
    if out is not None:
        assert got is out
        assert same(outside(big_o, out), around_o)
    assert_matches(got, oracle_rmsnorm(x0, w, case["eps"], bias), dtype)
    assert same(outside(big_x, x), around_x)
    if case["out"] != "input":
        assert same(x, x0)  # the input is only read


# --------------------------------------------------------------------------------------------
# RMSNorm family: valid calls


@pytest.mark.parametrize("backend,path", with_paths(NORM_CPU))
@FUZZ
@given(case=norm_cases())
def test_valid_rmsnorm_calls_match_float64(backend, path, case, monkeypatch):
    use_path(path, monkeypatch)
    run_norm_case(case, backend, "cpu")


# --------------------------------------------------------------------------------------------
# RMSNorm family: one value wrong


def _alias_case(kind: str, buf: torch.Tensor, rows: int, gemma: bool):
    """``(call, function, words)`` for one destructive aliasing of ``buf [rows + 1, hidden]``."""
    hidden, dtype = buf.shape[1], buf.dtype
    fresh = lambda n=rows: torch.randn(n, hidden).to(dtype)  # noqa: E731
    w = fresh(1)[0]
    x = buf[:rows]
    prefix = "gemma_" if gemma else ""
    fused = getattr(fnorm, prefix + "fused_add_rmsnorm")
    plain = getattr(fnorm, prefix + "rmsnorm")
    cases = {
        "residual_is_input": (lambda: fused(x, x, w), "fused_add_rmsnorm", ("residual", "input")),
        "residual_overlaps_input": (lambda: fused(x, buf[1:], w), "fused_add_rmsnorm",
                                    ("residual", "input")),
        "weight_in_residual": (lambda: fused(fresh(), x, x[0]), "fused_add_rmsnorm",
                               ("residual", "weight")),
        "weight_in_input": (lambda: fused(x, fresh(), x[rows - 1]), "fused_add_rmsnorm",
                            ("input", "weight")),
        "input_expanded": (lambda: fused(buf[:1].expand(rows, hidden), fresh(), w),
                           "fused_add_rmsnorm", ("input", "stride 0")),
        "out_shifted": (lambda: plain(x, w, out=buf[1:]), "rmsnorm", ("out", "input")),
        "out_holds_weight": (lambda: plain(fresh(rows + 1), buf[rows], out=buf), "rmsnorm",
                             ("out", "weight")),
        "out_expanded": (lambda: plain(x, w, out=torch.empty(1, hidden, dtype=dtype)
                                       .expand(rows, hidden)), "rmsnorm", ("out", "stride 0")),
    }
    call, function, words = cases[kind]
    return call, prefix + function, words


ALIASES = ["residual_is_input", "residual_overlaps_input", "weight_in_residual", "weight_in_input",
           "input_expanded", "out_shifted", "out_holds_weight", "out_expanded"]


@FUZZ
@given(kind=st.sampled_from(ALIASES), rows=st.integers(2, 4), hidden=st.integers(2, 9),
       gemma=st.booleans(), dtype=st.sampled_from(DTYPES))
def test_destructive_aliasing_raises_naming_both(kind, rows, hidden, gemma, dtype):
    buf = torch.randn(rows + 1, hidden).to(dtype)
    snapshot = buf.clone()
    call, function, words = _alias_case(kind, buf, rows, gemma)
    with raises_naming(function + ":", *words):
        call()
    assert torch.equal(buf, snapshot)  # raised before any kernel wrote


@FUZZ
@given(eps=st.sampled_from([float("nan"), -1e-6, -1.0, float("inf"), -float("inf")]),
       fn=st.sampled_from(["rmsnorm", "gemma_rmsnorm", "fused_add_rmsnorm",
                           "gemma_fused_add_rmsnorm", "layernorm"]))
def test_bad_eps_raises_naming_it(eps, fn):
    x, r, w = torch.randn(2, 8), torch.randn(2, 8), torch.randn(8)
    x0, r0 = x.clone(), r.clone()
    args = {"rmsnorm": (x, w), "gemma_rmsnorm": (x, w), "fused_add_rmsnorm": (x, r, w),
            "gemma_fused_add_rmsnorm": (x, r, w), "layernorm": (x, w, w)}[fn]
    with raises_naming("eps"):
        getattr(fnorm, fn)(*args, eps)
    assert torch.equal(x, x0) and torch.equal(r, r0)


def test_out_exactly_input_is_allowed_for_every_layout():
    """The one allowed alias: ``out`` the very same view as ``input`` (row-wise kernels read a
    row before they write it), also for a strided 3-D per-head view and a non-unit last stride."""
    for backend in NORM_CPU:
        for x in (torch.randn(3, 2, 8)[:, :, ::1], torch.randn(3, 16)[:, ::2],
                  torch.randn(4, 3, 8).transpose(0, 1)):
            w = torch.randn(x.shape[-1])
            want = oracle_rmsnorm(x, w, 1e-6, 0.0)
            assert fnorm.rmsnorm(x, w, out=x, backend=backend) is x
            assert_matches(x, want, torch.float32)


# --------------------------------------------------------------------------------------------
# LayerNorm


@st.composite
def layernorm_cases(draw):
    return {"rows": draw(st.integers(0, 3)), "hidden": draw(st.integers(1, 11)),
            "dtype": draw(st.sampled_from(DTYPES)), "eps": draw(st.sampled_from([1e-6, 0.5])),
            "nan_gamma": draw(st.booleans()), "seed": draw(st.integers(0, 2**16))}


def run_layernorm_case(case, backend, device):
    g = torch.Generator().manual_seed(case["seed"])
    big_x, x = embedded((case["rows"], case["hidden"]), case["dtype"], device, g)
    gamma = torch.randn(case["hidden"], generator=g).to(device)
    beta = torch.randn(case["hidden"], generator=g).to(device)
    if case["nan_gamma"]:
        gamma[0] = float("nan")
    x0, around = x.clone(), outside(big_x, x)
    got = fnorm.layernorm(x, gamma, beta, case["eps"], backend=backend)
    xd = x0.double()
    c = xd - xd.mean(-1, keepdim=True)
    want = c / torch.sqrt(c.square().mean(-1, keepdim=True) + case["eps"]) * gamma.double() \
        + beta.double()
    assert_matches(got, want, case["dtype"])
    assert same(x, x0) and same(outside(big_x, x), around)


@pytest.mark.parametrize("backend,path", with_paths(LN_CPU))
@FUZZ
@given(case=layernorm_cases())
def test_valid_layernorm_calls_match_float64(backend, path, case, monkeypatch):
    use_path(path, monkeypatch)
    run_layernorm_case(case, backend, "cpu")


# --------------------------------------------------------------------------------------------
# gated activations


_ACT = {"silu": lambda x: x * torch.sigmoid(x),
        "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
        "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi)
                                                         * (x + 0.044715 * x ** 3)))}


@st.composite
def act_cases(draw):
    lead = tuple(draw(st.lists(st.integers(0, 3), min_size=1, max_size=2)))
    return {"lead": lead, "d": draw(st.integers(1, 9)), "dtype": draw(st.sampled_from(DTYPES)),
            "act": draw(st.sampled_from(sorted(_ACT))), "out": draw(st.booleans()),
            "nan": draw(st.booleans()), "seed": draw(st.integers(0, 2**16))}


def run_act_case(case, backend, device):
    g = torch.Generator().manual_seed(case["seed"])
    lead, d, dtype = case["lead"], case["d"], case["dtype"]
    big_x, x = embedded(lead + (2 * d,), dtype, device, g)
    if case["nan"] and x.numel():
        x[(0,) * x.dim()] = float("nan")
    x0, around_x = x.clone(), outside(big_x, x)
    fn = getattr(fact, f"{case['act']}_and_mul")
    if case["out"]:
        big_o, out = embedded(lead + (d,), dtype, device, g)
        out.fill_(float("nan"))
        around_o = outside(big_o, out)
        assert fn(x, out, backend=backend) is out
        assert same(outside(big_o, out), around_o)
    else:
        out = fn(x, backend=backend)
    xd = x0.double()
    want = _ACT[case["act"]](xd[..., :d]) * xd[..., d:]
    assert_matches(out, want, dtype)
    assert same(x, x0) and same(outside(big_x, x), around_x)


@pytest.mark.parametrize("backend", ACT_CPU)
@FUZZ
@given(case=act_cases())
def test_valid_activation_calls_match_float64(backend, case):
    run_act_case(case, backend, "cpu")


@FUZZ
@given(act=st.sampled_from(sorted(_ACT)), rows=st.integers(1, 3), d=st.integers(1, 6),
       kind=st.sampled_from(["gate_half", "up_half", "shifted", "expanded"]))
def test_activation_out_aliasing_input_raises(act, rows, d, kind):
    buf = torch.randn(2 * rows, 2 * d)
    snapshot = buf.clone()
    x = buf[:rows]
    out = {"gate_half": x[:, :d], "up_half": x[:, d:], "shifted": buf[rows - 1:-1, 1:1 + d],
           "expanded": torch.empty(1, d).expand(rows, d)}[kind]
    with raises_naming(f"{act}_and_mul", "out", "stride 0" if kind == "expanded" else "input"):
        getattr(fact, f"{act}_and_mul")(x, out)
    assert torch.equal(buf, snapshot)


# --------------------------------------------------------------------------------------------
# GPU: the same generated calls over every backend usable on the device


@pytest.mark.gpu
@pytest.mark.parametrize("backend", NORM_GPU)
@FUZZ
@given(case=norm_cases())
def test_gpu_valid_rmsnorm_calls_match_float64(backend, case):
    run_norm_case(case, backend, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", LN_GPU)
@FUZZ
@given(case=layernorm_cases())
def test_gpu_valid_layernorm_calls_match_float64(backend, case):
    run_layernorm_case(case, backend, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ACT_GPU)
@FUZZ
@given(case=act_cases())
def test_gpu_valid_activation_calls_match_float64(backend, case):
    run_act_case(case, backend, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", NORM_GPU)
def test_gpu_residual_is_input_raises(backend):
    x, w = torch.randn(4, 64, device="cuda"), torch.randn(64, device="cuda")
    before = x.clone()
    with raises_naming("fused_add_rmsnorm", "residual", "input"):
        fnorm.fused_add_rmsnorm(x, x, w, backend=backend)
    assert torch.equal(x, before)
