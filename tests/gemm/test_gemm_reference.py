"""GEMM reference and torch paths vs float64 naive math on CPU, and the fp8 quantisers."""

import pytest
import torch

import flashinfer
from flashinfer import quantization as Q
from flashinfer.dispatch import kernel_for
from flashinfer.gemm import bmm_fp8, gemm_fp8_nt_blockscaled, gemm_fp8_nt_groupwise, mm_bf16, mm_fp8
from conftest import TOLERANCE, poison, rel_error

MS = [1, 7, 128]
FP8_TOL = 1e-2  # both sides use the same quantised values: only the output rounding differs


def _naive_block_dequant(q, scale, gr, gc):
    """float64 q * scale[i // gr, j // gc], by explicit indices."""
    rows = torch.arange(q.shape[0])[:, None] // gr
    cols = torch.arange(q.shape[1])[None, :] // gc
    return q.double() * scale.double()[rows, cols]


def _scaled_mm_runs_on_cpu() -> bool:
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.bfloat16)
    except Exception:  # noqa: BLE001 - any failure means "not on this build"
        return False
    return True


needs_cpu_scaled_mm = pytest.mark.skipif(not _scaled_mm_runs_on_cpu(),
                                         reason="torch._scaled_mm does not run on this CPU build")


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_mm_bf16(backend, out_dtype, m, with_bias):
    torch.manual_seed(m + 3 * with_bias)
    k, n = 40, 24
    a = torch.randn(m, k, dtype=torch.bfloat16)
    b = torch.randn(n, k, dtype=torch.bfloat16).t()  # column-major, as upstream passes it
    bias = torch.randn(n, dtype=torch.bfloat16) if with_bias else None
    out = poison(torch.empty(m, n, dtype=out_dtype))
    result = mm_bf16(a, b, bias, out=out, out_dtype=out_dtype, backend=backend)
    assert result is out
    expected = a.double() @ b.double() + (bias.double() if with_bias else 0)
    tol = 1e-6 if out_dtype == torch.float32 else TOLERANCE[out_dtype]
    assert rel_error(result, expected) < tol


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_mm_bf16_row_major_b(backend):
    torch.manual_seed(1)
    a, b = torch.randn(7, 32, dtype=torch.bfloat16), torch.randn(32, 16, dtype=torch.bfloat16)
    assert rel_error(mm_bf16(a, b, backend=backend), a.double() @ b.double()) < 1e-2


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_bmm_fp8_reference(fp8, m, out_dtype):
    torch.manual_seed(m)
    batch, k, n = 3, 48, 32
    A, A_s = Q.quantize_fp8_per_tensor(torch.randn(batch, m, k), fp8)
    B, B_s = Q.quantize_fp8_per_tensor(torch.randn(batch, n, k), torch.float8_e4m3fn)
    B = B.transpose(-2, -1)  # [b, k, n] column-major
    out = poison(torch.empty(batch, m, n, dtype=out_dtype))
    result = bmm_fp8(A, B, A_s, B_s, out_dtype, out=out, backend="reference")
    assert result is out
    expected = (A.double() @ B.double()) * A_s.double() * B_s.double()
    assert rel_error(result, expected) < FP8_TOL


@pytest.mark.parametrize("m", MS)
def test_mm_fp8_alpha(m):
    torch.manual_seed(m)
    a, a_s = Q.quantize_fp8_per_tensor(torch.randn(m, 64))
    b, b_s = Q.quantize_fp8_per_tensor(torch.randn(32, 64))
    result = mm_fp8(a, b, a_s * b_s, backend="reference")
    expected = (a.double() @ b.double().t()) * (a_s * b_s).double()
    assert result.dtype == torch.bfloat16 and rel_error(result, expected) < FP8_TOL
    plain = mm_fp8(a, b, backend="reference")
    assert rel_error(plain, a.double() @ b.double().t()) < FP8_TOL


# granularity, K, N: aligned and misaligned (partial last blocks)
GROUPWISE = [((1, 128, 128), 256, 256), ((128, 128, 128), 256, 128), ((1, 128, 128), 200, 40),
             ((1, 64, 32), 96, 72), ((1, 1, 64), 64, 48)]


@pytest.mark.parametrize("granularity,k,n", GROUPWISE)
@pytest.mark.parametrize("mode", [None, "K", "MN"])
@pytest.mark.parametrize("m", MS)
def test_gemm_fp8_nt_groupwise_reference(granularity, k, n, mode, m):
    torch.manual_seed(m + k + n)
    gm, gn, gk = granularity
    a, a_s = Q.quantize_fp8_blockwise(torch.randn(m, k), (gm, gk))
    b, b_s = Q.quantize_fp8_blockwise(torch.randn(n, k), (gn, gk))
    expected = _naive_block_dequant(a, a_s, gm, gk) @ _naive_block_dequant(b, b_s, gn, gk).t()
    if mode == "MN":
        a_s, b_s = a_s.t().contiguous(), b_s.t().contiguous()
    out = poison(torch.empty(m, n, dtype=torch.float16))
    result = gemm_fp8_nt_groupwise(a, b, a_s, b_s, mode, 1, granularity, out=out,
                                   backend="reference")
    assert result is out
    assert rel_error(result, expected) < FP8_TOL


def test_gemm_fp8_nt_blockscaled_matches_groupwise():
    torch.manual_seed(0)
    a, a_s = Q.quantize_fp8_blockwise(torch.randn(130, 256), (128, 128))
    b, b_s = Q.quantize_fp8_blockwise(torch.randn(128, 256), (128, 128))
    result = gemm_fp8_nt_blockscaled(a, b, a_s.t(), b_s.t())  # default scale_major_mode="MN"
    expected = _naive_block_dequant(a, a_s, 128, 128) @ _naive_block_dequant(b, b_s, 128, 128).t()
    assert result.dtype == torch.bfloat16 and rel_error(result, expected) < FP8_TOL


def test_fp8_gemm_close_to_unquantised_product():
    torch.manual_seed(0)
    x, w = torch.randn(16, 256), torch.randn(64, 256)
    xq, xs = Q.per_token_group_quant_8bit(x, 128)
    wq, ws = Q.quantize_fp8_blockwise(w, (128, 128))
    result = gemm_fp8_nt_groupwise(xq, wq, xs, ws)
    assert rel_error(result, x.double() @ w.double().t()) < 5e-2


# torch kernels called directly (the dispatcher only offers them on CUDA)


@needs_cpu_scaled_mm
@pytest.mark.parametrize("m", MS)
def test_torch_bmm_fp8_kernel_on_cpu(m):
    torch.manual_seed(m)
    A, A_s = Q.quantize_fp8_per_tensor(torch.randn(2, m, 32))
    B, B_s = Q.quantize_fp8_per_tensor(torch.randn(2, 32, 16))  # row-major: adapter re-lays it
    out = poison(torch.empty(2, m, 16, dtype=torch.bfloat16))
    kernel_for("torch", "bmm_fp8", "scaled_mm")(A, B, A_s, B_s, out)
    expected = (A.double() @ B.double()) * A_s.double() * B_s.double()
    assert rel_error(out, expected) < FP8_TOL


@needs_cpu_scaled_mm
@pytest.mark.parametrize("m", MS)
def test_torch_rowwise_kernel_on_cpu(m):
    torch.manual_seed(m)
    a, a_s = Q.quantize_fp8_per_token(torch.randn(m, 64))
    b, b_s = Q.quantize_fp8_per_token(torch.randn(32, 64))
    out = poison(torch.empty(m, 32, dtype=torch.bfloat16))
    try:
        kernel_for("torch", "gemm_fp8_groupwise", "scaled_mm_rowwise")(a, b, a_s, b_s,
                                                                        (1, 1, 64), out)
    except RuntimeError as exc:
        pytest.skip(f"row-wise torch._scaled_mm not on this CPU build: {exc}")
    expected = (a.double() * a_s.double()) @ (b.double() * b_s.double()).t()
    assert rel_error(out, expected) < FP8_TOL


# quantisers


@pytest.mark.parametrize("dst", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8])
def test_per_token_group_quant_8bit(dst):
    torch.manual_seed(0)
    x = torch.randn(5, 3, 256, dtype=torch.bfloat16)
    q, s = Q.per_token_group_quant_8bit(x, 128, dst_dtype=dst)
    assert q.shape == x.shape and q.dtype == dst and s.shape == (5, 3, 2)
    limit = 127.0 if dst == torch.int8 else torch.finfo(dst).max
    groups = x.double().reshape(5, 3, 2, 128)
    assert torch.allclose(s.double(), groups.abs().amax(-1) / limit, rtol=1e-6)
    deq = q.double().reshape(5, 3, 2, 128) * s.double().unsqueeze(-1)
    tol = {torch.float8_e4m3fn: 4e-2, torch.float8_e5m2: 8e-2, torch.int8: 1e-2}[dst]
    assert rel_error(deq, groups) < tol
    assert q.double().abs().reshape(5, 3, 2, 128).amax(-1).eq(limit).all()


def test_per_token_group_quant_column_major_scales():
    x = torch.randn(7, 256)
    _, s_row = Q.per_token_group_quant_8bit(x, 128)
    _, s_col = Q.per_token_group_quant_8bit(x, 128, column_major_scales=True,
                                            scale_tma_aligned=True)
    assert torch.equal(s_row, s_col)
    assert s_col.stride() == (1, 8)  # rows padded to a multiple of 4 in storage


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (3, 5)])
def test_quantize_fp8_blockwise_partial_blocks(block):
    torch.manual_seed(0)
    x = torch.randn(130, 200)
    q, s = Q.quantize_fp8_blockwise(x, block)
    bm, bk = block
    assert s.shape == (-(-130 // bm), -(-200 // bk))
    assert rel_error(_naive_block_dequant(q, s, bm, bk), x.double()) < 4e-2


def test_quantize_fp8_per_tensor_and_token():
    torch.manual_seed(0)
    x = torch.randn(9, 64)
    q, s = Q.quantize_fp8_per_tensor(x)
    assert s.dim() == 0 and torch.isclose(s, x.abs().max() / 448)
    assert rel_error(q.double() * s.double(), x.double()) < 4e-2
    q, s = Q.quantize_fp8_per_token(x)
    assert s.shape == (9, 1) and torch.allclose(s, x.abs().amax(1, keepdim=True) / 448)


def test_top_level_names():
    assert flashinfer.quantization.per_token_group_quant_8bit is Q.per_token_group_quant_8bit
    for name in ("mm_bf16", "bmm_fp8", "mm_fp8"):
        assert getattr(flashinfer, name) is getattr(flashinfer.gemm, name)
