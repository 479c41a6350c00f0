"""GEMM API: validation (one test per rule, the message names the argument), return
conventions, backend spellings, torch.compile."""

import pytest
import torch

import flashinfer
from flashinfer import quantization as Q
from flashinfer.dispatch import BackendUnavailableError
from flashinfer.gemm import bmm_fp8, gemm_fp8_nt_blockscaled, gemm_fp8_nt_groupwise, mm_bf16, mm_fp8
from conftest import poison, rel_error

E4M3 = torch.float8_e4m3fn


def _bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def _fp8(*shape):
    return torch.randn(*shape).to(E4M3)


def _one():
    return torch.tensor(1.0)


# --------------------------------------------------------------------------------------------
# mm_bf16


MM_BF16_BAD = [
    ("a", TypeError, lambda: mm_bf16([[1.0]], _bf16(4, 4))),
    ("a", ValueError, lambda: mm_bf16(_bf16(2, 4, 4), _bf16(4, 4))),
    ("a", ValueError, lambda: mm_bf16(torch.randn(4, 4), _bf16(4, 4))),
    ("b", ValueError, lambda: mm_bf16(_bf16(4, 4), torch.randn(4, 4, dtype=torch.float16))),
    ("b", ValueError, lambda: mm_bf16(_bf16(4, 8), _bf16(4, 4))),
    ("bias", ValueError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4), _bf16(5))),
    ("bias", ValueError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4), torch.randn(4))),
    ("out_dtype", ValueError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4), out_dtype=torch.int32)),
    ("out", ValueError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4), out=_bf16(4, 5))),
    ("out", ValueError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4),
                                        out=torch.empty(4, 4, dtype=torch.float16))),
    ("out", ValueError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4), out=_bf16(4, 4).t())),
    ("out", TypeError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4), out=3)),
    ("backend", TypeError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4), backend=1)),
    ("backend", ValueError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4), backend="nope")),
    ("backend", ValueError, lambda: mm_bf16(_bf16(4, 8), _bf16(8, 4), backend="tgv")),
]


@pytest.mark.parametrize("name,exc,call", MM_BF16_BAD,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(MM_BF16_BAD)])
def test_mm_bf16_rejects(name, exc, call):
    with pytest.raises(exc, match=rf"^{name}\b"):
        call()


def test_mm_bf16_allocates_out_dtype():
    torch.manual_seed(0)
    a, b = _bf16(3, 8), _bf16(8, 5)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        out = mm_bf16(a, b, out_dtype=dtype)
        assert out.shape == (3, 5) and out.dtype == dtype and out.is_contiguous()


def test_mm_bf16_writes_poisoned_out_and_returns_it():
    torch.manual_seed(0)
    a, b = _bf16(9, 16), _bf16(16, 12)
    out = poison(torch.empty(9, 12, dtype=torch.bfloat16))
    assert mm_bf16(a, b, out=out) is out
    assert rel_error(out, a.double() @ b.double()) < 1e-2


def test_mm_bf16_empty():
    assert mm_bf16(_bf16(0, 8), _bf16(8, 4)).shape == (0, 4)


def test_backend_spellings():
    a, b = _bf16(4, 8), _bf16(8, 4)
    for spelling, chosen in (("cublas", "torch"), ("cublaslt", "torch"), ("torch", "torch"),
                             ("reference", "reference"), ("auto", "reference")):  # CPU: see mm_bf16.toml
        with flashinfer.record_decisions() as log:
            mm_bf16(a, b, backend=spelling)
        assert log[-1].backend == chosen, spelling
    for upstream_only in ("tinygemm", "cutile", "trtllm_low_latency", "cutedsl_low_latency"):
        with pytest.raises(ValueError, match="no counterpart"):
            mm_bf16(a, b, backend=upstream_only)


def test_named_backend_without_kernel_is_strict(monkeypatch):
    """Upstream's kernel name runs the best backend and says so; strict with FLASHINFER_STRICT."""
    with flashinfer.record_decisions() as log:
        mm_bf16(_bf16(4, 8), _bf16(8, 4), backend="cudnn")
    assert log[-1].backend == "reference" and "backend='cudnn'" in log[-1].notes[0]
    monkeypatch.setenv("FLASHINFER_STRICT", "1")
    with pytest.raises(BackendUnavailableError, match="cudnn"):
        mm_bf16(_bf16(4, 8), _bf16(8, 4), backend="cudnn")


def test_use_backend_gemm_family():
    with flashinfer.use_backend(gemm="reference"), flashinfer.record_decisions() as log:
        mm_bf16(_bf16(4, 8), _bf16(8, 4))
    assert log[-1].backend == "reference" and log[-1].source == "context"


# --------------------------------------------------------------------------------------------
# bmm_fp8 / mm_fp8


BMM_BAD = [
    ("A", ValueError, lambda: bmm_fp8(_bf16(2, 4, 16), _fp8(2, 16, 16), _one(), _one(),
                                      torch.bfloat16)),
    ("A", ValueError, lambda: bmm_fp8(_fp8(4, 16), _fp8(2, 16, 16), _one(), _one(),
                                      torch.bfloat16)),
    ("B", ValueError, lambda: bmm_fp8(_fp8(2, 4, 16), _fp8(2, 8, 16), _one(), _one(),
                                      torch.bfloat16)),
    ("B", ValueError, lambda: bmm_fp8(_fp8(2, 4, 16), _fp8(3, 16, 16), _one(), _one(),
                                      torch.bfloat16)),
    ("A_scale", TypeError, lambda: bmm_fp8(_fp8(2, 4, 16), _fp8(2, 16, 16), 1.0, _one(),
                                           torch.bfloat16)),
    ("A_scale", ValueError, lambda: bmm_fp8(_fp8(2, 4, 16), _fp8(2, 16, 16), torch.ones(2),
                                            _one(), torch.bfloat16)),
    ("B_scale", ValueError, lambda: bmm_fp8(_fp8(2, 4, 16), _fp8(2, 16, 16), _one(),
                                            torch.tensor(1.0, dtype=torch.float64),
                                            torch.bfloat16)),
    ("dtype", ValueError, lambda: bmm_fp8(_fp8(2, 4, 16), _fp8(2, 16, 16), _one(), _one(),
                                          torch.float32)),
    ("out", ValueError, lambda: bmm_fp8(_fp8(2, 4, 16), _fp8(2, 16, 16), _one(), _one(),
                                        torch.bfloat16, out=_bf16(2, 4, 8))),
]


@pytest.mark.parametrize("name,exc,call", BMM_BAD, ids=[f"{i}-{c[0]}" for i, c in enumerate(BMM_BAD)])
def test_bmm_fp8_rejects(name, exc, call):
    with pytest.raises(exc, match=rf"^{name}\b"):
        call()


def test_bmm_fp8_returns_poisoned_out():
    torch.manual_seed(0)
    A, B = _fp8(2, 5, 16), _fp8(2, 16, 8)
    out = poison(torch.empty(2, 5, 8, dtype=torch.float16))
    assert bmm_fp8(A, B, _one(), torch.tensor(0.5), torch.float16, out=out) is out
    assert rel_error(out, (A.double() @ B.double()) * 0.5) < 1e-2
    assert bmm_fp8(A, B, _one(), _one(), torch.bfloat16).dtype == torch.bfloat16


MM_FP8_BAD = [
    ("a", ValueError, lambda: mm_fp8(_bf16(4, 16), _fp8(8, 16))),
    ("b", ValueError, lambda: mm_fp8(_fp8(4, 16), _fp8(8, 32))),
    ("b", ValueError, lambda: mm_fp8(_fp8(4, 256), _fp8(2, 8, 128))),  # prepared weight
    ("alpha", ValueError, lambda: mm_fp8(_fp8(4, 16), _fp8(8, 16), torch.ones(2))),
    ("out_dtype", ValueError, lambda: mm_fp8(_fp8(4, 16), _fp8(8, 16), out_dtype=torch.float16)),
    ("out", ValueError, lambda: mm_fp8(_fp8(4, 16), _fp8(8, 16), out=_bf16(8, 4))),
    ("backend", ValueError, lambda: mm_fp8(_fp8(4, 16), _fp8(8, 16),
                                           backend="trtllm_low_latency")),
]


@pytest.mark.parametrize("name,exc,call", MM_FP8_BAD,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(MM_FP8_BAD)])
def test_mm_fp8_rejects(name, exc, call):
    with pytest.raises(exc, match=rf"^{name}\b"):
        call()


def test_mm_fp8_returns_poisoned_out():
    a, b = _fp8(3, 32), _fp8(8, 32)
    out = poison(torch.empty(3, 8, dtype=torch.bfloat16))
    assert mm_fp8(a, b, out=out) is out and not torch.isnan(out).any()


# --------------------------------------------------------------------------------------------
# gemm_fp8_nt_groupwise / blockscaled


def _gw(**kw):
    args = dict(a=_fp8(4, 256), b=_fp8(128, 256), a_scale=torch.ones(4, 2),
                b_scale=torch.ones(1, 2))
    args.update(kw)
    return lambda: gemm_fp8_nt_groupwise(**args)


GW_BAD = [
    ("a", ValueError, _gw(a=_bf16(4, 256))),
    ("b", ValueError, _gw(b=_fp8(128, 128))),
    ("a_scale", ValueError, _gw(a_scale=torch.ones(4, 3))),
    ("a_scale", ValueError, _gw(a_scale=torch.ones(4, 2, dtype=torch.bfloat16))),
    ("b_scale", ValueError, _gw(b_scale=torch.ones(2, 1))),
    ("b_scale", ValueError, _gw(b_scale=torch.ones(2, 1), scale_major_mode="K")),
    ("a_scale", ValueError, _gw(scale_major_mode="MN")),  # K-major shapes given for MN
    ("scale_major_mode", ValueError, _gw(scale_major_mode="row")),
    ("mma_sm", ValueError, _gw(mma_sm=3)),
    ("scale_granularity_mnk", ValueError, _gw(scale_granularity_mnk=(1, 128))),
    ("scale_granularity_mnk", ValueError, _gw(scale_granularity_mnk=(0, 128, 128))),
    ("out_dtype", ValueError, _gw(out_dtype=torch.float32)),
    ("out", ValueError, _gw(out=_bf16(4, 64))),
]


@pytest.mark.parametrize("name,exc,call", GW_BAD, ids=[f"{i}-{c[0]}" for i, c in enumerate(GW_BAD)])
def test_groupwise_rejects(name, exc, call):
    with pytest.raises(exc, match=rf"^{name}\b"):
        call()


def test_groupwise_out_dtype_from_out():
    torch.manual_seed(0)
    out = poison(torch.empty(4, 128, dtype=torch.float16))
    result = _gw(out=out, out_dtype=torch.bfloat16)()
    assert result is out and not torch.isnan(out).any()
    assert _gw()().dtype == torch.bfloat16


def test_blockscaled_backend_keyword_and_mode_default():
    a, b = _fp8(4, 256), _fp8(128, 256)
    a_s, b_s = torch.ones(2, 1), torch.ones(2, 1)  # MN-major: [k/128, ceil(m/128)]
    with flashinfer.record_decisions() as log:
        out = gemm_fp8_nt_blockscaled(a, b, a_s, b_s, backend="reference")
    assert out.shape == (4, 128)
    assert log[-1].problem.features == frozenset({"scale_128x128"})


# --------------------------------------------------------------------------------------------
# torch.compile


def test_mm_bf16_compiles_fullgraph():
    torch.manual_seed(0)
    a, b, bias = _bf16(6, 32), _bf16(32, 16), _bf16(16)
    compiled = torch.compile(lambda x, y, z: mm_bf16(x, y, z, out_dtype=torch.float32),
                             fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(a, b, bias), mm_bf16(a, b, bias, out_dtype=torch.float32))


def test_groupwise_compiles_fullgraph():
    torch.manual_seed(0)
    xq, xs = Q.per_token_group_quant_8bit(torch.randn(8, 256), 128)
    wq, ws = Q.quantize_fp8_blockwise(torch.randn(128, 256), (128, 128))
    compiled = torch.compile(lambda *t: gemm_fp8_nt_groupwise(*t, scale_major_mode="K"),
                             fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(xq, wq, xs, ws),
                               gemm_fp8_nt_groupwise(xq, wq, xs, ws, scale_major_mode="K"))


def test_repeated_fp8_calls_allocate_fresh_outputs_and_check_aliasing():
    """dense._CHECKED_FP8: a repeat of a checked bmm_fp8 / mm_fp8 call skips the checks, but
    returns a new output when none is given, still refuses an out sharing memory with an
    operand, and reads the overrides."""
    from flashinfer.gemm import dense

    torch.manual_seed(0)
    fp8 = torch.float8_e4m3fn
    a = (torch.randn(4, 32) * 0.5).to(fp8)
    w = (torch.randn(16, 32) * 0.5).to(fp8)
    scale = torch.tensor([0.5])
    dense._CHECKED_FP8.clear()
    first = flashinfer.mm_fp8(a, w, scale)
    second = flashinfer.mm_fp8(a, w, scale)
    assert len(dense._CHECKED_FP8) == 1 and second is not first
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    A, B = a[None], w.t()[None]
    out = torch.empty(1, 4, 16, dtype=torch.bfloat16)
    flashinfer.bmm_fp8(A, B, scale, scale, torch.bfloat16, out)
    with flashinfer.record_decisions() as log:
        again = flashinfer.bmm_fp8(A, B, scale, scale, torch.bfloat16, out)
    assert again is out and log[-1].backend == "reference"
    inside_out = out.view(torch.float32).view(-1)[:1]  # a scale's facts, out's memory
    inside_out.fill_(0.5)
    with pytest.raises(ValueError, match="shares memory with B_scale"):
        flashinfer.bmm_fp8(A, B, scale, inside_out, torch.bfloat16, out)
    with flashinfer.use_backend(gemm="triton"), flashinfer.record_decisions() as log:
        flashinfer.bmm_fp8(A, B, scale, scale, torch.bfloat16, out)
    assert log[-1].backend == "triton"
