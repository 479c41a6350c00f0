"""flashinfer.activation: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.

Reference backend vs float64 math written here; Triton (interpreted on CPU) vs the reference at
small shapes; one test per validation rule; Decisions on simulated SMs; torch.compile; and GPU
tests (marker ``gpu``) of every backend that serves the op vs the reference.
"""

import math

import pytest
import torch

import flashinfer.activation as fact
from conftest import TOLERANCE, poison, rel_error
from flashinfer import dispatch, use_backend
from flashinfer.backends.triton import activation as triton_act
from flashinfer.device import simulated, sm_family
from flashinfer.dispatch import BackendUnavailableError, Problem, select

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
FUNCS = {"silu": fact.silu_and_mul, "gelu": fact.gelu_and_mul, "gelu_tanh": fact.gelu_tanh_and_mul}


# --- float64 oracle ------------------------------------------------------------------------

def naive(activation, x):
    x = x.double()
    d = x.shape[-1] // 2
    g, up = x[..., :d], x[..., d:]
    if activation == "silu":
        act = g / (1 + torch.exp(-g))
    elif activation == "gelu":
        act = 0.5 * g * (1 + torch.erf(g / math.sqrt(2)))
    else:
        act = 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    return act * up


def rand(*shape, dtype=torch.float32, device="cpu"):
    return (torch.randn(*shape, dtype=torch.float32, device=device) * 2).to(dtype)


# --- reference backend vs float64 ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", list(FUNCS))
@pytest.mark.parametrize("shape", [(6, 128), (2, 3, 34), (40,)], ids=["2d", "3d", "1d"])
def test_reference_vs_float64(dtype, activation, shape):
    torch.manual_seed(1)
    x = rand(*shape, dtype=dtype)
    out = FUNCS[activation](x, backend="reference")
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    assert rel_error(out, naive(activation, x)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("activation", list(FUNCS))
def test_gelu_forms_differ(activation):
    """The three activations are distinct functions (guards against a swapped dispatch)."""
    torch.manual_seed(2)
    x = rand(4, 64)
    others = [a for a in FUNCS if a != activation]
    out = FUNCS[activation](x)
    for other in others:
        assert rel_error(out, naive(other, x)) > 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_buffer_and_strided_input(dtype):
    torch.manual_seed(3)
    x = rand(5, 2, 3, 48, dtype=dtype)[:, 1]  # [5, 3, 48] with a gap between rows
    out = poison(torch.empty(3, 5, 24, dtype=dtype)).transpose(0, 1)  # [5, 3, 24] non-contiguous
    result = fact.silu_and_mul(x, out, backend="reference")
    assert result is out
    assert rel_error(out, naive("silu", x)) <= TOLERANCE[dtype]


def test_enable_pdl_is_accepted_and_ignored():
    torch.manual_seed(4)
    x = rand(3, 16)
    torch.testing.assert_close(fact.gelu_and_mul(x, enable_pdl=True), fact.gelu_and_mul(x))


def test_empty_rows():
    assert fact.silu_and_mul(torch.empty(0, 8)).shape == (0, 4)


# --- Triton (interpreted on CPU) vs reference ---------------------------------------------

def _inputs(kind, dtype):
    if kind == "2d":
        return rand(4, 2 * 70, dtype=dtype)  # d not a multiple of the block or of 16
    if kind == "3d_strided":
        return rand(2, 3, 2, 64, dtype=dtype)[:, :, 1]  # [2, 3, 64], rows not mergeable
    return rand(64, 3, dtype=dtype).t()  # last dim not unit-stride: copied by the launcher


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", list(FUNCS))
@pytest.mark.parametrize("kind", ["2d", "3d_strided", "transposed"])
def test_triton_vs_reference(dtype, activation, kind):
    torch.manual_seed(5)
    x = _inputs(kind, dtype)
    fn = FUNCS[activation]
    out = poison(torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=dtype))
    fn(x, out, backend="triton")
    assert rel_error(out, fn(x, backend="reference")) <= TOLERANCE[dtype]


def test_triton_several_column_blocks_and_strided_out(monkeypatch):
    monkeypatch.setattr(triton_act, "MAX_BLOCK", 16)
    torch.manual_seed(6)
    x = rand(3, 2 * 50, dtype=torch.float16)
    out = poison(torch.empty(50, 3, dtype=torch.float16)).t()  # written via a buffer, copied back
    fact.gelu_tanh_and_mul(x, out, backend="triton")
    assert rel_error(out, naive("gelu_tanh", x)) <= TOLERANCE[torch.float16]


def test_triton_launch_config():
    assert triton_act.launch_config(14336) == (1024, 4)
    assert triton_act.launch_config(70) == (128, 1)


# --- bad input: one test per rule ----------------------------------------------------------

BAD = [
    ("input_not_tensor", lambda: fact.silu_and_mul([1.0, 2.0]), TypeError, "input"),
    ("input_dtype", lambda: fact.silu_and_mul(rand(2, 8).double()), TypeError, "input"),
    ("input_int", lambda: fact.gelu_and_mul(torch.ones(2, 8, dtype=torch.int32)), TypeError, "input"),
    ("input_0d", lambda: fact.silu_and_mul(torch.tensor(1.0)), ValueError, "input"),
    ("input_odd", lambda: fact.silu_and_mul(rand(2, 7)), ValueError, "input"),
    ("input_empty_last", lambda: fact.gelu_tanh_and_mul(torch.empty(2, 0)), ValueError, "input"),
    ("out_not_tensor", lambda: fact.silu_and_mul(rand(2, 8), out=0), TypeError, "out"),
    ("out_shape", lambda: fact.silu_and_mul(rand(2, 8), out=torch.empty(2, 8)), ValueError, "out"),
    ("out_rank", lambda: fact.silu_and_mul(rand(2, 8), out=torch.empty(8)), ValueError, "out"),
    ("out_dtype", lambda: fact.silu_and_mul(rand(2, 8), out=torch.empty(2, 4, dtype=torch.float16)),
     TypeError, "out"),
    ("out_device", lambda: fact.silu_and_mul(rand(2, 8), out=torch.empty(2, 4, device="meta")),
     ValueError, "out"),
    ("backend_type", lambda: fact.silu_and_mul(rand(2, 8), backend=3), TypeError, "backend"),
    ("backend_unknown", lambda: fact.silu_and_mul(rand(2, 8), backend="fast"), ValueError, "backend"),
]


@pytest.mark.parametrize("call, exc, name", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


def test_named_backend_without_a_kernel_raises():
    with pytest.raises(BackendUnavailableError, match="flash_attn has no kernel for act_and_mul"):
        fact.silu_and_mul(rand(2, 8), backend="flash_attn")


def test_an_upstream_kernel_name_without_a_kernel_runs_the_best_and_says_so(monkeypatch):
    with dispatch.record_decisions() as log:
        fact.silu_and_mul(rand(2, 8), backend="cutlass")
    assert log[-1].backend == "reference" and "backend='cutlass'" in log[-1].notes[0]
    monkeypatch.setenv("FLASHINFER_STRICT", "1")
    with pytest.raises(BackendUnavailableError, match="cutlass has no kernel for act_and_mul"):
        fact.silu_and_mul(rand(2, 8), backend="cutlass")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendUnavailableError, match="runs on cuda only"):
        fact.silu_and_mul(rand(2, 8), backend="triton")


# --- Decisions on simulated devices --------------------------------------------------------

SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]


def _problem(sm, activation="silu", dtype="bfloat16"):
    return Problem.make("act_and_mul", simulated(sm), dtypes={"input": dtype},
                        shape={"hidden_size": 14336, "num_rows": 256}, features=(activation,))


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("activation", list(FUNCS))
def test_decision_per_sm(sm, activation):
    decision = select(_problem(sm, activation), assume_installed=True)
    triton = next(c for c in decision.candidates if c.backend == "triton")
    assert decision.source == "default" and "foundation_h200" in decision.basis
    if sm == "cpu":
        assert decision.backend == "reference" and decision.rule == "priority[cpu]"
        assert [r.field for r in triton.reasons] == ["device"]
    else:
        assert decision.backend == "triton" and decision.order == ("triton", "reference")
        assert decision.rule == f"priority[{sm_family(simulated(sm).sm)}]"


def test_decision_rejects_triton_for_unsupported_dtype():
    decision = select(_problem("9.0", dtype="float64"), assume_installed=True)
    triton = next(c for c in decision.candidates if c.backend == "triton")
    assert decision.backend == "reference" and [r.field for r in triton.reasons] == ["dtype.input"]


def test_public_calls_build_the_expected_problem(monkeypatch):
    seen = []
    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda p, b="auto": seen.append(p) or real(p, b))
    fact.silu_and_mul(rand(2, 3, 10))
    fact.gelu_and_mul(rand(5, 8, dtype=torch.bfloat16))
    fact.gelu_tanh_and_mul(rand(12, dtype=torch.float16))
    assert [(sorted(p.features), dict(p.shape), dict(p.dtypes)) for p in seen] == [
        (["silu"], {"hidden_size": 5, "num_rows": 8}, {"input": "float32"}),
        (["gelu"], {"hidden_size": 4, "num_rows": 8}, {"input": "bfloat16"}),
        (["gelu_tanh"], {"hidden_size": 6, "num_rows": 1}, {"input": "float16"}),
    ]


def test_context_and_environment_overrides_reach_triton(monkeypatch):
    torch.manual_seed(7)
    x = rand(3, 20)
    expected = fact.silu_and_mul(x, backend="reference")
    calls = []
    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda p, b="auto": calls.append(real(p, b)) or calls[-1])
    with use_backend(activation="triton"):
        assert rel_error(fact.silu_and_mul(x), expected) <= TOLERANCE[torch.float32]
    monkeypatch.setenv("FLASHINFER_ACTIVATION_BACKEND", "triton")
    assert rel_error(fact.silu_and_mul(x), expected) <= TOLERANCE[torch.float32]
    assert [(d.backend, d.source) for d in calls] == [("triton", "context"), ("triton", "environment")]


# --- torch.compile -------------------------------------------------------------------------

@pytest.mark.parametrize("activation", list(FUNCS))
def test_compile_fullgraph(activation):
    torch.manual_seed(8)
    x = rand(4, 2, 32)
    fn = FUNCS[activation]

    def f(x):
        return fn(x) + 1

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), f(x))


def test_compile_fullgraph_with_out():
    torch.manual_seed(9)
    x = rand(3, 16)

    def f(x, out):
        fact.silu_and_mul(x, out)
        return out * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out_c, out_e = poison(torch.empty(3, 8)), poison(torch.empty(3, 8))
    torch.testing.assert_close(compiled(x, out_c), f(x, out_e))
    torch.testing.assert_close(out_c, out_e)


def test_compile_dynamic_shapes():
    compiled = torch.compile(fact.silu_and_mul, fullgraph=True, backend="aot_eager", dynamic=True)
    torch.manual_seed(11)
    for rows in (3, 5, 9):
        x = rand(rows, 2, 24)
        torch.testing.assert_close(compiled(x), fact.silu_and_mul(x))


# --- GPU: every backend serving the op vs the reference ------------------------------------

def _gpu_backends():
    from flashinfer.capability_db import database

    return sorted({r.backend for r in database().for_op("act_and_mul")} - {"reference"})


@pytest.mark.gpu
@pytest.mark.parametrize("backend", _gpu_backends())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", list(FUNCS))
@pytest.mark.parametrize("shape", [(1, 256), (7, 2 * 4096), (33, 2 * 14336), (4, 5, 2 * 1000)], ids=str)
def test_gpu_vs_reference(backend, dtype, activation, shape):
    torch.manual_seed(10)
    x = rand(*shape, dtype=dtype, device="cuda")
    fn = FUNCS[activation]
    out = poison(torch.empty(*shape[:-1], shape[-1] // 2, dtype=dtype, device="cuda"))
    fn(x, out, backend=backend)
    assert rel_error(out, fn(x, backend="reference")) <= TOLERANCE[dtype]
