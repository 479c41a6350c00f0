"""flashinfer.norm: RMSNorm (plain, fused add, Gemma, per-head) and LayerNorm.

Reference backend vs float64 math written here; Triton (interpreted on CPU) vs the reference at
small shapes; one test per validation rule; Decisions on simulated SMs; torch.compile; and GPU
tests (marker ``gpu``) of every backend that serves the ops vs the reference.
"""

import pytest
import torch

import flashinfer.norm as fnorm
from conftest import TOLERANCE, poison, rel_error
from flashinfer import use_backend
from flashinfer import dispatch
from flashinfer.backends.triton import norm as triton_norm
from flashinfer.device import simulated, sm_family
from flashinfer.dispatch import BackendUnavailableError, Problem, select

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
EPS = 1e-6


# --- float64 oracle ------------------------------------------------------------------------

def naive_rmsnorm(x, w, eps=EPS, bias=0.0):
    x = x.double()
    rms = (x.pow(2).sum(-1, keepdim=True) / x.shape[-1] + eps).sqrt()
    return x / rms * (w.double() + bias)


def naive_layernorm(x, g, b, eps=EPS):
    x = x.double()
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    var = (x - mean).pow(2).sum(-1, keepdim=True) / x.shape[-1]
    return (x - mean) / (var + eps).sqrt() * g.double() + b.double()


def rand(*shape, dtype=torch.float32, device=None):
    return torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)


# --- reference backend vs float64 ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape", [(7, 96), (3, 5, 64)], ids=["2d", "per_head"])
def test_rmsnorm_reference_vs_float64(dtype, gemma, shape):
    torch.manual_seed(1)
    x, w = rand(*shape, dtype=dtype), rand(shape[-1], dtype=dtype)
    fn = fnorm.gemma_rmsnorm if gemma else fnorm.rmsnorm
    out = fn(x, w, backend="reference")
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_error(out, naive_rmsnorm(x, w, bias=float(gemma))) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_out_buffer_and_strided_views(dtype):
    torch.manual_seed(2)
    big = rand(6, 2, 80, dtype=dtype)
    x = big[:, 1, :72]  # row stride 160, last-dim stride 1
    w = rand(72, dtype=torch.float32)  # weight dtype may differ from input
    out = poison(torch.empty(72, 6, dtype=dtype)).t()  # non-contiguous out
    result = fnorm.rmsnorm(x, w, 1e-5, out, backend="reference")
    assert result is out
    assert rel_error(out, naive_rmsnorm(x, w, 1e-5)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_rmsnorm_reference_vs_float64(dtype, gemma):
    torch.manual_seed(3)
    x, r, w = rand(9, 128, dtype=dtype), rand(9, 128, dtype=dtype), rand(128, dtype=dtype)
    summed = (x.double() + r.double()).to(dtype)  # the stored residual is rounded to the dtype
    expected = naive_rmsnorm(summed, w, bias=float(gemma))
    fn = fnorm.gemma_fused_add_rmsnorm if gemma else fnorm.fused_add_rmsnorm
    assert fn(x, r, w, backend="reference") is None
    assert rel_error(r, summed) <= TOLERANCE[dtype]
    assert rel_error(x, expected) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_reference_vs_float64(dtype):
    torch.manual_seed(4)
    x = rand(5, 200, dtype=dtype) * 3 + 1
    g, b = rand(200), rand(200)
    out = fnorm.layernorm(x, g, b, backend="reference")
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_error(out, naive_layernorm(x, g, b)) <= TOLERANCE[dtype]


def test_enable_pdl_is_accepted_and_ignored():
    torch.manual_seed(5)
    x, w = rand(4, 32), rand(32)
    torch.testing.assert_close(fnorm.rmsnorm(x, w, enable_pdl=True), fnorm.rmsnorm(x, w))


def test_empty_batch():
    x, w = torch.empty(0, 64), rand(64)
    assert fnorm.rmsnorm(x, w).shape == (0, 64)
    fnorm.fused_add_rmsnorm(x, torch.empty(0, 64), w)
    assert fnorm.layernorm(x, w, w).shape == (0, 64)


# --- Triton (interpreted on CPU) vs reference ---------------------------------------------

@pytest.fixture(params=["single_pass", "looped"])
def triton_path(request, monkeypatch, kernel_device):
    """Run the Triton kernels as launched (one tile per row) or forced to loop over 32-wide
    chunks; on the GPU when there is one (conftest.kernel_device)."""
    if request.param == "looped":
        monkeypatch.setattr(triton_norm, "MAX_SINGLE_BLOCK", 16)
        monkeypatch.setattr(triton_norm, "LOOP_BLOCK", 32)
    return request.param


def _rmsnorm_inputs(kind, dtype):
    if kind == "2d":
        return rand(5, 100, dtype=dtype)
    if kind == "per_head":  # [tokens, heads, head_dim] slice of a wider head dim
        return rand(3, 4, 2, 48, dtype=dtype)[:, :, 1, :40]
    return rand(100, 5, dtype=dtype).t()  # last dim not unit-stride: copied by the launcher


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["2d", "per_head", "transposed"])
def test_rmsnorm_triton_vs_reference(dtype, kind, triton_path):
    torch.manual_seed(6)
    x = _rmsnorm_inputs(kind, dtype)
    w = rand(x.shape[-1], dtype=dtype)
    for fn in (fnorm.rmsnorm, fnorm.gemma_rmsnorm):
        out = poison(torch.empty_like(x))
        fn(x, w, EPS, out, backend="triton")
        assert rel_error(out, fn(x, w, backend="reference")) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["2d", "per_head", "transposed"])
def test_fused_add_rmsnorm_triton_vs_reference(dtype, kind, triton_path):
    torch.manual_seed(7)
    x = _rmsnorm_inputs(kind, dtype)
    r, w = rand(*x.shape, dtype=dtype), rand(x.shape[-1], dtype=dtype)
    for fn in (fnorm.fused_add_rmsnorm, fnorm.gemma_fused_add_rmsnorm):
        x_ref, r_ref = x.clone(), r.clone()
        fn(x_ref, r_ref, w, backend="reference")
        x_tri, r_tri = x.clone(), r.clone()
        fn(x_tri, r_tri, w, backend="triton")
        assert rel_error(r_tri, r_ref) <= TOLERANCE[dtype]
        assert rel_error(x_tri, x_ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_triton_vs_reference(dtype, triton_path):
    torch.manual_seed(8)
    x = (rand(4, 2, 90, dtype=dtype) * 2 + 3)[:, 1]  # strided rows, mean far from zero
    g, b = rand(90), rand(90)
    out = fnorm.layernorm(x, g, b, backend="triton")
    assert rel_error(out, fnorm.layernorm(x, g, b, backend="reference")) <= TOLERANCE[dtype]


def test_triton_launch_config():
    assert triton_norm.launch_config(128, 1000) == (8, 128, True, 4)
    assert triton_norm.launch_config(128, 3) == (4, 128, True, 2)
    assert triton_norm.launch_config(4096, 10) == (1, 4096, True, 16)
    assert triton_norm.launch_config(65536, 10) == (1, triton_norm.LOOP_BLOCK, False, 16)


# --- bad input: one test per rule ----------------------------------------------------------

def _x():
    return rand(4, 64)


BAD_RMSNORM = [
    ("input_not_tensor", lambda: fnorm.rmsnorm([[1.0]], rand(1)), TypeError, "input"),
    ("input_dtype", lambda: fnorm.rmsnorm(_x().double(), rand(64)), TypeError, "input"),
    ("input_int", lambda: fnorm.rmsnorm(torch.ones(4, 64, dtype=torch.int32), rand(64)), TypeError, "input"),
    ("input_rank1", lambda: fnorm.rmsnorm(rand(64), rand(64)), ValueError, "input"),
    ("input_rank4", lambda: fnorm.rmsnorm(rand(1, 2, 3, 64), rand(64)), ValueError, "input"),
    ("input_hidden_0", lambda: fnorm.rmsnorm(torch.empty(4, 0), torch.empty(0)), ValueError, "input"),
    ("weight_shape", lambda: fnorm.rmsnorm(_x(), rand(32)), ValueError, "weight"),
    ("weight_rank", lambda: fnorm.rmsnorm(_x(), rand(1, 64)), ValueError, "weight"),
    ("weight_dtype", lambda: fnorm.rmsnorm(_x(), torch.ones(64, dtype=torch.int64)), TypeError, "weight"),
    ("weight_device", lambda: fnorm.rmsnorm(_x(), torch.empty(64, device="meta")), ValueError, "weight"),
    ("out_shape", lambda: fnorm.rmsnorm(_x(), rand(64), out=torch.empty(4, 63)), ValueError, "out"),
    ("out_dtype", lambda: fnorm.rmsnorm(_x(), rand(64), out=torch.empty(4, 64, dtype=torch.float16)),
     TypeError, "out"),
    ("out_device", lambda: fnorm.rmsnorm(_x(), rand(64), out=torch.empty(4, 64, device="meta")),
     ValueError, "out"),
    ("out_not_tensor", lambda: fnorm.rmsnorm(_x(), rand(64), out=1.0), TypeError, "out"),
    ("eps_negative", lambda: fnorm.rmsnorm(_x(), rand(64), -1e-6), ValueError, "eps"),
    ("eps_nan", lambda: fnorm.rmsnorm(_x(), rand(64), float("nan")), ValueError, "eps"),
    ("eps_type", lambda: fnorm.rmsnorm(_x(), rand(64), "1e-6"), TypeError, "eps"),
    ("backend_type", lambda: fnorm.rmsnorm(_x(), rand(64), backend=None), TypeError, "backend"),
    ("backend_unknown", lambda: fnorm.rmsnorm(_x(), rand(64), backend="nope"), ValueError, "backend"),
    ("residual_shape", lambda: fnorm.fused_add_rmsnorm(_x(), rand(4, 32), rand(64)), ValueError, "residual"),
    ("residual_dtype", lambda: fnorm.fused_add_rmsnorm(_x(), rand(4, 64).half(), rand(64)),
     TypeError, "residual"),
    ("residual_device", lambda: fnorm.fused_add_rmsnorm(_x(), torch.empty(4, 64, device="meta"), rand(64)),
     ValueError, "residual"),
    ("fused_weight_shape", lambda: fnorm.gemma_fused_add_rmsnorm(_x(), rand(4, 64), rand(65)),
     ValueError, "weight"),
    ("layernorm_rank", lambda: fnorm.layernorm(rand(2, 4, 64), rand(64), rand(64)), ValueError, "input"),
    ("layernorm_dtype", lambda: fnorm.layernorm(_x().double(), rand(64), rand(64)), TypeError, "input"),
    ("layernorm_gemma_shape", lambda: fnorm.layernorm(_x(), rand(63), rand(64)), ValueError, "gemma"),
    ("layernorm_beta_shape", lambda: fnorm.layernorm(_x(), rand(64), rand(2, 64)), ValueError, "beta"),
    ("layernorm_beta_dtype", lambda: fnorm.layernorm(_x(), rand(64), torch.ones(64, dtype=torch.int32)),
     TypeError, "beta"),
    ("layernorm_eps", lambda: fnorm.layernorm(_x(), rand(64), rand(64), float("inf")), ValueError, "eps"),
]


@pytest.mark.parametrize("call, exc, name", [c[1:] for c in BAD_RMSNORM], ids=[c[0] for c in BAD_RMSNORM])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


def test_triton_cannot_take_a_hidden_size_above_its_limit():
    x, w = rand(1, 65537), rand(65537)
    with pytest.raises(BackendUnavailableError, match="hidden_size=65537"):
        fnorm.rmsnorm(x, w, backend="triton")
    assert rel_error(fnorm.rmsnorm(x, w), naive_rmsnorm(x, w)) <= TOLERANCE[torch.float32]


def test_named_backend_without_a_kernel_raises(monkeypatch):
    with pytest.raises(BackendUnavailableError, match="flash_attn has no kernel for rmsnorm"):
        fnorm.rmsnorm(_x(), rand(64), backend="flash_attn")
    monkeypatch.setenv("FLASHINFER_STRICT", "1")  # upstream's kernel names: strict only then
    with pytest.raises(BackendUnavailableError, match="cudnn has no kernel for rmsnorm"):
        fnorm.rmsnorm(_x(), rand(64), backend="cudnn")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendUnavailableError, match="runs on cuda only"):
        fnorm.layernorm(_x(), rand(64), rand(64), backend="triton")


# --- Decisions on simulated devices --------------------------------------------------------

SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]
RMSNORM_FEATURES = [(), ("fused_add",), ("gemma_weight",), ("per_head",), ("fused_add", "gemma_weight"),
                    ("gemma_weight", "per_head")]


def _problem(op, sm, dtype="bfloat16", hidden=4096, features=()):
    return Problem.make(op, simulated(sm), dtypes={"input": dtype, "weight": dtype},
                        shape={"hidden_size": hidden, "num_rows": 64}, features=features)


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("op, features", [("rmsnorm", f) for f in RMSNORM_FEATURES] + [("layernorm", ())])
def test_decision_per_sm(sm, op, features):
    decision = select(_problem(op, sm, features=features), assume_installed=True)
    triton = next(c for c in decision.candidates if c.backend == "triton")
    assert decision.source == "default"
    assert decision.basis  # every rule names the measurement behind it
    if sm == "cpu":
        assert decision.backend == "reference" and decision.rule == "priority[cpu]"
        assert [r.field for r in triton.reasons] == ["device"]
    else:
        assert decision.backend == "triton" and decision.order == ("triton", "reference")
        assert decision.rule == f"priority[{sm_family(simulated(sm).sm)}]"
        assert triton.usable


@pytest.mark.parametrize("sm", ["8.0", "9.0", "12.0"])
def test_decision_rejects_triton_beyond_its_limits(sm):
    decision = select(_problem("rmsnorm", sm, hidden=131072), assume_installed=True)
    triton = next(c for c in decision.candidates if c.backend == "triton")
    assert decision.backend == "reference" and [r.field for r in triton.reasons] == ["hidden_size"]
    decision = select(_problem("layernorm", sm, dtype="float64"), assume_installed=True)
    triton = next(c for c in decision.candidates if c.backend == "triton")
    assert decision.backend == "reference" and [r.field for r in triton.reasons] == ["dtype.input"]


def test_decision_on_cpu_under_the_interpreter_still_prefers_the_reference():
    decision = select(_problem("rmsnorm", "cpu"), triton_interpret=True)
    assert decision.backend == "reference" and decision.order == ("reference", "triton")


def test_public_calls_build_the_expected_problem():
    with dispatch.record_decisions() as log:
        fnorm.rmsnorm(rand(5, 64), rand(64))
        fnorm.gemma_rmsnorm(rand(3, 4, 16, dtype=torch.float16), rand(16))
        fnorm.gemma_fused_add_rmsnorm(rand(2, 8), rand(2, 8), rand(8))
        fnorm.layernorm(rand(3, 8, dtype=torch.bfloat16), rand(8), rand(8))
    seen = [d.problem for d in log]
    assert [(p.op, sorted(p.features), dict(p.shape), dict(p.dtypes)) for p in seen] == [
        ("rmsnorm", [], {"hidden_size": 64, "num_rows": 8}, {"input": "float32", "weight": "float32"}),
        ("rmsnorm", ["gemma_weight", "per_head"], {"hidden_size": 16, "num_rows": 16},
         {"input": "float16", "weight": "float32"}),
        ("rmsnorm", ["fused_add", "gemma_weight"], {"hidden_size": 8, "num_rows": 2},
         {"input": "float32", "weight": "float32"}),
        ("layernorm", [], {"hidden_size": 8, "num_rows": 4}, {"input": "bfloat16", "weight": "float32"}),
    ]


def test_context_and_environment_overrides_reach_triton(monkeypatch, kernel_device):
    torch.manual_seed(9)
    x, w = rand(3, 40), rand(40)
    expected = fnorm.rmsnorm(x, w, backend="reference")
    with dispatch.record_decisions() as calls:
        with use_backend(norm="triton"):
            assert rel_error(fnorm.rmsnorm(x, w), expected) <= TOLERANCE[torch.float32]
        monkeypatch.setenv("FLASHINFER_NORM_BACKEND", "triton")
        assert rel_error(fnorm.rmsnorm(x, w), expected) <= TOLERANCE[torch.float32]
    assert [(d.backend, d.source) for d in calls] == [("triton", "context"), ("triton", "environment")]


# --- torch.compile -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rmsnorm", "gemma_rmsnorm", "layernorm"])
def test_compile_fullgraph_out_of_place(name):
    torch.manual_seed(10)
    x, w, b = rand(4, 32), rand(32), rand(32)
    fn = getattr(fnorm, name)
    args = (x, w, b) if name == "layernorm" else (x, w)

    def f(*a):
        return fn(*a) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args), f(*args))


def test_compile_fullgraph_rmsnorm_with_out():
    torch.manual_seed(11)
    x, w = rand(2, 3, 16), rand(16)

    def f(x, w, out):
        fnorm.rmsnorm(x, w, 1e-5, out)
        return out + 1

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out_c, out_e = poison(torch.empty_like(x)), poison(torch.empty_like(x))
    torch.testing.assert_close(compiled(x, w, out_c), f(x, w, out_e))
    torch.testing.assert_close(out_c, out_e)


@pytest.mark.parametrize("name", ["fused_add_rmsnorm", "gemma_fused_add_rmsnorm"])
def test_compile_fullgraph_in_place(name):
    torch.manual_seed(12)
    x, r, w = rand(4, 32), rand(4, 32), rand(32)
    fn = getattr(fnorm, name)

    def f(x, r, w):
        fn(x, r, w)
        return x * 1

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x_c, r_c, x_e, r_e = x.clone(), r.clone(), x.clone(), r.clone()
    torch.testing.assert_close(compiled(x_c, r_c, w), f(x_e, r_e, w))
    torch.testing.assert_close(x_c, x_e)
    torch.testing.assert_close(r_c, r_e)


def test_compile_dynamic_shapes_and_eps():
    """Batch size and eps vary between calls: one dynamic graph, no graph break."""
    def f(x, r, w, eps):
        y = fnorm.rmsnorm(x, w, eps)
        fnorm.fused_add_rmsnorm(x, r, w, eps)
        return y + fnorm.layernorm(x, w, w, eps)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    torch.manual_seed(15)
    for batch in (3, 5, 9):
        x, r, w = rand(batch, 16), rand(batch, 16), rand(16)
        x_e, r_e = x.clone(), r.clone()
        torch.testing.assert_close(compiled(x, r, w, 1e-5 * batch), f(x_e, r_e, w, 1e-5 * batch))
        torch.testing.assert_close((x, r), (x_e, r_e))


# --- GPU: every backend serving the ops vs the reference -----------------------------------

def _gpu_backends(op):
    from flashinfer.capability_db import database

    return sorted({r.backend for r in database().for_op(op)} - {"reference"})


GPU_SHAPES = [(1, 128), (7, 4096), (33, 5120), (5, 16384), (2, 65536), (64, 8, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", _gpu_backends("rmsnorm"))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_gpu_rmsnorm_vs_reference(backend, dtype, shape):
    torch.manual_seed(13)
    x = rand(*shape[:-1], shape[-1] + 8, dtype=dtype, device="cuda")[..., :shape[-1]]
    w = rand(shape[-1], dtype=dtype, device="cuda")
    for fn in (fnorm.rmsnorm, fnorm.gemma_rmsnorm):
        out = poison(torch.empty_like(x))
        fn(x, w, EPS, out, backend=backend)
        assert rel_error(out, fn(x, w, backend="reference")) <= TOLERANCE[dtype]
    r = rand(*shape, dtype=dtype, device="cuda")
    for fn in (fnorm.fused_add_rmsnorm, fnorm.gemma_fused_add_rmsnorm):
        x_ref, r_ref, x_b, r_b = x.clone(), r.clone(), x.clone(), r.clone()
        fn(x_ref, r_ref, w, backend="reference")
        fn(x_b, r_b, w, backend=backend)
        assert rel_error(r_b, r_ref) <= TOLERANCE[dtype]
        assert rel_error(x_b, x_ref) <= TOLERANCE[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", _gpu_backends("layernorm"))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [s for s in GPU_SHAPES if len(s) == 2], ids=str)
def test_gpu_layernorm_vs_reference(backend, dtype, shape):
    torch.manual_seed(14)
    x = rand(*shape, dtype=dtype, device="cuda") * 2 + 1
    g, b = rand(shape[-1], device="cuda"), rand(shape[-1], device="cuda")
    out = fnorm.layernorm(x, g, b, backend=backend)
    assert rel_error(out, fnorm.layernorm(x, g, b, backend="reference")) <= TOLERANCE[dtype]


@pytest.mark.gpu
def test_gpu_auto_picks_triton():
    problem = Problem.make("rmsnorm", torch.device("cuda"), dtypes={"input": torch.bfloat16},
                           shape={"hidden_size": 4096, "num_rows": 8})
    assert dispatch.decide(problem).backend == "triton"


def test_a_repeated_call_still_checks_out_aliasing_and_follows_overrides():
    """norm._CHECKED_NORMS: a second call with the same signature skips the metadata checks,
    but an ``out`` that is a shifted view of ``input`` (same shape, dtype, device) still
    raises, and a use_backend override still applies."""
    torch.manual_seed(0)
    x, w = torch.randn(9, 64), torch.randn(64)
    fnorm._CHECKED_NORMS.clear()
    first = fnorm.rmsnorm(x[:8], w, out=torch.empty(8, 64))
    assert len(fnorm._CHECKED_NORMS) == 1
    with pytest.raises(ValueError, match="shares memory with input"):
        fnorm.rmsnorm(x[:8], w, out=x[1:9])
    with dispatch.record_decisions() as log:
        again = fnorm.rmsnorm(x[:8], w, out=torch.empty(8, 64))
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert log[-1].backend == "reference"
    with use_backend(norm="triton"), dispatch.record_decisions() as log:
        fnorm.rmsnorm(x[:8], w, out=torch.empty(8, 64))  # (the interpreter on a CPU)
    assert log[-1].backend == "triton"
