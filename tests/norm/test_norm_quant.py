"""rmsnorm_quant / fused_add_rmsnorm_quant (upstream's RMSNorm into fp8) against float64 math:
out = fp8(clamp(x * rsqrt(mean(x^2) + eps) * w * (1 / scale), -M, M)), M the fp8 dtype's largest
finite value; and layernorm_quant (LayerNorm rounded to the input dtype, then the same cast)."""

from __future__ import annotations

import pytest
import torch

import flashinfer

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def naive(x, w, scale, eps, out_dtype):
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    inv = float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(float(scale), dtype=torch.float32))
    bound = torch.finfo(out_dtype).max
    return (y * inv).clamp(-bound, bound).to(out_dtype)


def _fp8_close(got, want):
    """Within one fp8 step: the float32 chain may round once differently from float64."""
    g, w = got.double(), want.double()
    step = torch.where(w.abs() > 0, w.abs() * (2 ** -2 if got.dtype == torch.float8_e5m2 else 2 ** -3),
                       torch.full_like(w, 2 ** -6))
    assert bool(((g - w).abs() <= step + 1e-12).all()), float((g - w).abs().max())


@pytest.mark.parametrize("out_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale_kind", ["float", "tensor"])
def test_rmsnorm_quant(out_dtype, dtype, scale_kind):
    torch.manual_seed(0)
    x, w = (torch.randn(6, 96) * 3).to(dtype), torch.randn(96).to(dtype)
    scale = 0.05 if scale_kind == "float" else torch.tensor([0.05])
    out = torch.empty(6, 96, dtype=out_dtype)
    assert flashinfer.rmsnorm_quant(out, x, w, scale, 1e-5) is None
    _fp8_close(out, naive(x, w, 0.05, 1e-5, out_dtype))
    assert out.float().abs().max() <= torch.finfo(out_dtype).max


def test_fused_add_rmsnorm_quant_updates_the_residual_only():
    torch.manual_seed(1)
    x, r, w = torch.randn(4, 64).bfloat16(), torch.randn(4, 64).bfloat16(), torch.randn(64).bfloat16()
    x0, r0 = x.clone(), r.clone()
    out = torch.empty(4, 64, dtype=torch.float8_e4m3fn)
    flashinfer.norm.fused_add_rmsnorm_quant(out, x, r, w, torch.tensor(0.5), 1e-6)
    torch.testing.assert_close(x, x0, rtol=0, atol=0)
    torch.testing.assert_close(r, (r0.float() + x0.float()).bfloat16(), rtol=0, atol=0)
    _fp8_close(out, naive(r, w, 0.5, 1e-6, torch.float8_e4m3fn))


@pytest.mark.parametrize("call, exc, words", [
    (lambda x, w: flashinfer.rmsnorm_quant(torch.empty(2, 8), x, w, 1.0), TypeError, "float8"),
    (lambda x, w: flashinfer.rmsnorm_quant(torch.empty(2, 4, dtype=torch.float8_e4m3fn), x, w, 1.0),
     ValueError, "shape"),
    (lambda x, w: flashinfer.rmsnorm_quant(torch.empty(2, 8, dtype=torch.float8_e4m3fn), x, w, 0.0),
     ValueError, "scale"),
    (lambda x, w: flashinfer.rmsnorm_quant(torch.empty(2, 8, dtype=torch.float8_e4m3fn), x, w,
                                           torch.ones(2)), ValueError, "one-element"),
    (lambda x, w: flashinfer.fused_add_rmsnorm_quant(torch.empty(2, 8, dtype=torch.float8_e4m3fn),
                                                     x, x, w, 1.0), ValueError, "residual"),
])
def test_bad_arguments_are_named(call, exc, words):
    with pytest.raises(exc, match=words):
        call(torch.randn(2, 8), torch.randn(8))


def test_e5m2_saturates_at_its_own_range():
    torch.manual_seed(3)
    x, w = torch.randn(2, 64), torch.randn(64)
    out = torch.empty(2, 64, dtype=torch.float8_e5m2)
    flashinfer.rmsnorm_quant(out, x, w, 1e-4)
    assert out.float().abs().max().item() == 57344.0  # not e4m3's 448


@pytest.mark.parametrize("out_dtype", FP8)
@pytest.mark.parametrize("scale_kind", ["float", "tensor"])
def test_layernorm_quant(out_dtype, scale_kind):
    torch.manual_seed(4)
    x = (torch.randn(5, 111) * 2).bfloat16()
    gamma, beta = torch.randn(111), torch.randn(111)
    scale = 0.02 if scale_kind == "float" else torch.tensor([0.02])
    out = torch.empty(5, 111, dtype=out_dtype)
    assert flashinfer.norm.layernorm_quant(out, x, gamma, beta, scale) is None
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    y = (x64 - mean) * torch.rsqrt(((x64 - mean) ** 2).mean(-1, keepdim=True) + 1e-6)
    y = (y * gamma.double() + beta.double()).to(torch.bfloat16).double()  # rounded first
    bound = torch.finfo(out_dtype).max
    want = (y * (1 / 0.02)).clamp(-bound, bound).to(out_dtype)
    _fp8_close(out, want)
    with pytest.raises(TypeError, match="out dtype"):
        flashinfer.norm.layernorm_quant(torch.empty(5, 111), x, gamma, beta, 0.02)
