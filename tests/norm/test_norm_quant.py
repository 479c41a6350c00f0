"""rmsnorm_quant / fused_add_rmsnorm_quant (upstream's RMSNorm into fp8) against float64 math:
out = fp8(clamp(x * rsqrt(mean(x^2) + eps) * w * (1 / scale), -M, M)), M the fp8 dtype's largest
finite value; and layernorm_quant (LayerNorm rounded to the input dtype, then the same cast). On
CUDA (marker ``gpu``): layernorm_quant, and the rmsnorm_quant cases that
tests/attention/test_compat_gpu.py leaves out, against the CPU path."""

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


# --- GPU: the same calls on CUDA tensors vs their CPU copies (the reference path above) --------
# (bf16 rmsnorm_quant / fused_add_rmsnorm_quant into e4m3 on 2-D rows: test_compat_gpu.py)

DEV = "cuda"


def _poisoned_fp8(shape, dtype):
    """An fp8 buffer on DEV of NaN bytes (0x7F is NaN in e4m3fn and in e5m2): an element left
    unwritten stays NaN and fails the comparison."""
    t = torch.empty(shape, dtype=dtype, device=DEV)
    t.view(torch.uint8).fill_(0x7F)
    return t


def _assert_within_one_fp8_step(got, want):
    """``got`` (any device) vs ``want`` (CPU), one fp8 dtype, no NaN: at most one step of the fp8
    grid apart (2^(exponent - mantissa bits), the subnormal spacing below the smallest normal;
    a float32 rounding difference before the cast may cross a rounding boundary) and no more
    than 1% of the elements differing at all."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.cpu().double(), want.double()
    assert not torch.isnan(g).any(), f"{int(torch.isnan(g).sum())} elements NaN (unwritten?)"
    mantissa, min_exp = (3, -6) if got.dtype == torch.float8_e4m3fn else (2, -14)
    top = torch.maximum(g.abs(), w.abs()).clamp_min(2.0 ** min_exp)
    step = torch.exp2(torch.floor(torch.log2(top)) - mantissa)
    diff = (g - w).abs()
    assert bool((diff <= step).all()), f"{int((diff > step).sum())} elements more than a step off"
    assert (diff > 0).double().mean().item() <= 0.01, f"{int((diff > 0).sum())} elements differ"


def _assert_served_on_the_gpu(log, op):
    """``op`` was decided for the CUDA device and not served by the reference (its triton record
    covers fp16 / bf16 / fp32 rows up to 65536 wide on SM 7.5-12.1, first in its rule)."""
    mine = [d for d in log if d.problem.op == op]
    assert mine, f"no {op} decision in {[d.problem.op for d in log]}"
    for d in mine:
        assert d.problem.device == torch.device(DEV).type and d.backend != "reference", d.explain()


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("scale_kind", ["float", "tensor"])
def test_gpu_layernorm_quant_matches_the_cpu_path(out_dtype, scale_kind):
    """layernorm_quant on CUDA into a NaN-poisoned buffer: within one fp8 step of the CPU path."""
    g = torch.Generator().manual_seed(20)
    x = (torch.randn(37, 4096, generator=g) * 2 + 0.5).bfloat16()
    gamma, beta = torch.randn(4096, generator=g), torch.randn(4096, generator=g)
    want = torch.empty(37, 4096, dtype=out_dtype)
    flashinfer.norm.layernorm_quant(want, x, gamma, beta, 0.02, backend="reference")
    out = _poisoned_fp8((37, 4096), out_dtype)
    scale = 0.02 if scale_kind == "float" else torch.tensor([0.02], device=DEV)
    with flashinfer.record_decisions() as log:
        flashinfer.norm.layernorm_quant(out, x.to(DEV), gamma.to(DEV), beta.to(DEV), scale)
    _assert_served_on_the_gpu(log, "layernorm")
    _assert_within_one_fp8_step(out, want)
    if out_dtype == torch.float8_e4m3fn:
        assert want.float().abs().max().item() == 448.0  # the saturation was exercised


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_gpu_rmsnorm_quant_e5m2_per_head_fp16(fused):
    """(fused_add_)rmsnorm_quant on CUDA, 3-D fp16 into e5m2: one fp8 step of the CPU path."""
    # what test_compat_gpu.py does not run: per-head input, fp16, e5m2, a tensor scale; the
    # residual update bit-exact
    g = torch.Generator().manual_seed(21)
    x = (torch.randn(33, 8, 128, generator=g) * 3).half()
    r = torch.randn(33, 8, 128, generator=g).half()
    w = torch.randn(128, generator=g).half()
    want = torch.empty(33, 8, 128, dtype=torch.float8_e5m2)
    out = _poisoned_fp8((33, 8, 128), torch.float8_e5m2)
    scale = torch.tensor([0.01], device=DEV)
    r_cpu, r_dev = r.clone(), r.to(DEV)
    with flashinfer.record_decisions() as log:
        if fused:
            flashinfer.fused_add_rmsnorm_quant(out, x.to(DEV), r_dev, w.to(DEV), scale, 1e-5)
        else:
            flashinfer.rmsnorm_quant(out, x.to(DEV), w.to(DEV), scale, 1e-5)
    if fused:
        flashinfer.fused_add_rmsnorm_quant(want, x, r_cpu, w, 0.01, 1e-5, backend="reference")
        assert torch.equal(r_dev.cpu(), r_cpu)
    else:
        flashinfer.rmsnorm_quant(want, x, w, 0.01, 1e-5, backend="reference")
    _assert_served_on_the_gpu(log, "rmsnorm")
    _assert_within_one_fp8_step(out, want)
