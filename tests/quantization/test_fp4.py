"""FP4 (NVFP4 / MXFP4): e2m1 codes, quantisers, scale layouts, and ``mm_fp4`` (reference and
torch dequant backends, validation, decisions on simulated SMs, torch.compile).

The float64 oracles here decode nibbles and unswizzle scales with their own loops (the layout
formulas written out once more), never with flashinfer.quantization.fp4's helpers.
"""

import math

import pytest
import torch

import flashinfer
from flashinfer import fp4_format
from flashinfer.quantization import fp4
from flashinfer.device import simulated
from flashinfer.dispatch import BackendUnavailableError, Problem, StrictModeError, select

from conftest import TOLERANCE, poison, rel_error

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]


# --------------------------------------------------------------------------------------------
# float64 oracles (independent of flashinfer.quantization)


def code_value(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * GRID[code & 7]


def naive_decode(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [R, K/2] -> float64 [R, K], element 2j in the low nibble."""
    rows, half = packed.shape
    out = torch.empty(rows, 2 * half, dtype=torch.float64)
    table = torch.tensor([code_value(c) for c in range(16)], dtype=torch.float64)
    p = packed.cpu().long()
    out[:, 0::2] = table[p & 0xF]
    out[:, 1::2] = table[p >> 4]
    return out


def offset(r: int, c: int, cols: int, layout: str) -> int:
    cp = -(-cols // 4) * 4
    if layout == "linear":
        return r * cols + c
    if layout == "128x4":
        return ((r // 128) * 128 * cp + (c // 4) * 512 + (r % 32) * 16
                + ((r % 128) // 32) * 4 + c % 4)
    return (r // 8) * 8 * cp + (c // 4) * 32 + (r % 8) * 4 + c % 4


def naive_unswizzle(storage: torch.Tensor, rows: int, cols: int, layout: str) -> torch.Tensor:
    flat = storage.cpu().reshape(-1).view(torch.uint8)
    out = torch.empty(rows, cols, dtype=torch.uint8)
    for r in range(rows):
        for c in range(cols):
            out[r, c] = flat[offset(r, c, cols, layout)]
    return out


def naive_scales(raw_u8: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    if ue8m0:
        return torch.pow(2.0, raw_u8.double() - 127.0)
    return raw_u8.view(torch.float8_e4m3fn).double()


def naive_dequant(packed, sf_storage, rows, block, layout, ue8m0) -> torch.Tensor:
    vals = naive_decode(packed)
    cols = vals.shape[1] // block
    sf = naive_scales(naive_unswizzle(sf_storage, rows, cols, layout), ue8m0)
    return vals * sf.repeat_interleave(block, dim=1)


def nearest_code_value(v: torch.Tensor) -> torch.Tensor:
    """Brute force: the grid value nearest to v (saturating; a tie goes to the even code),
    float64."""
    grid = torch.tensor(GRID, dtype=torch.float64)
    odd = torch.arange(8, dtype=torch.float64) % 2
    mag = grid[((v.abs().unsqueeze(-1) - grid).abs() + odd * 1e-12).argmin(-1)]
    return torch.where(v < 0, -mag, mag)


# --------------------------------------------------------------------------------------------
# e2m1 codes


def test_e2m1_round_trip_of_all_16_codes():
    codes = torch.arange(16, dtype=torch.uint8)
    values = fp4_format.e2m1_to_float(codes, torch.float64)
    assert values.tolist() == [code_value(c) for c in range(16)]
    assert torch.equal(fp4_format.float_to_e2m1(values), codes)  # -0.0 keeps its sign bit (code 8)


def test_e2m1_rounding_ties_to_even_and_saturation():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert fp4_format.e2m1_to_float(fp4_format.float_to_e2m1(ties)).tolist() == [0, 1, 1, 2, 2, 4, 4]
    assert fp4_format.e2m1_to_float(fp4_format.float_to_e2m1(-ties)).tolist() == [0, -1, -1, -2, -2, -4, -4]
    big = torch.tensor([6.5, 7.0, 1e9, -1e9])
    assert fp4_format.e2m1_to_float(fp4_format.float_to_e2m1(big)).tolist() == [6, 6, 6, -6]
    torch.manual_seed(0)
    x = torch.randn(4096, dtype=torch.float64) * 3
    got = fp4_format.e2m1_to_float(fp4_format.float_to_e2m1(x), torch.float64)
    assert torch.equal(got, nearest_code_value(x))


def test_packing_puts_even_elements_in_the_low_nibble():
    x = torch.tensor([[0.5, 1.0, -6.0, 3.0] + [0.0] * 12])  # amax 6: scale 1 with g = 1
    x_q, sf = flashinfer.fp4_quantize(x, None, is_sf_swizzled_layout=False)
    assert sf.float().tolist() == [[1.0]]
    assert x_q[0, 0].item() == 0x21 and x_q[0, 1].item() == (0xF | (0x5 << 4))


# --------------------------------------------------------------------------------------------
# quantisers


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_nvfp4_quantize_matches_float64_recipe(dtype):
    torch.manual_seed(1)
    x = (torch.randn(37, 96) * 5).to(dtype)
    g = 448 * 6 / x.float().abs().max()
    x_q, sf = flashinfer.fp4_quantize(x, g.reshape(1), is_sf_swizzled_layout=False)
    assert x_q.shape == (37, 48) and x_q.dtype == torch.uint8
    assert sf.shape == (37, 6) and sf.dtype == torch.float8_e4m3fn
    xd = x.double()
    amax = xd.reshape(37, 6, 16).abs().amax(-1)
    want_sf = (float(g) * amax / 6).to(torch.float8_e4m3fn)
    assert torch.equal(sf.view(torch.uint8), want_sf.view(torch.uint8))
    scale = want_sf.double().repeat_interleave(16, 1) / float(g)
    want = nearest_code_value(xd / scale) * scale
    got = naive_decode(x_q) * scale
    assert torch.equal(got, want)
    assert rel_error(got, xd) < 0.12  # FP4: about 9% relative error on Gaussian data


def test_mxfp4_quantize_scales_and_error():
    torch.manual_seed(2)
    x = torch.randn(20, 128, dtype=torch.bfloat16) * 3
    x_q, sf = flashinfer.mxfp4_quantize(x, sfLayout=flashinfer.SfLayout.layout_linear)
    assert sf.shape == (20, 4) and sf.dtype == torch.uint8
    amax = x.double().reshape(20, 4, 32).abs().amax(-1)
    scale = torch.pow(2.0, sf.double() - 127)
    assert bool((scale >= amax / 6).all()) and bool((scale / 2 < amax / 6).all())
    full = scale.repeat_interleave(32, 1)
    assert torch.equal(naive_decode(x_q) * full, nearest_code_value(x.double() / full) * full)
    assert rel_error(flashinfer.mxfp4_dequantize(x_q, sf, flashinfer.SfLayout.layout_linear),
                     x.double()) < 0.15
    assert torch.equal(flashinfer.mxfp4_dequantize_host(x_q, sf),
                       flashinfer.mxfp4_dequantize(x_q, sf, flashinfer.SfLayout.layout_linear))


def test_zero_blocks_quantise_to_zero():
    x = torch.zeros(3, 32)
    x[1, 16:] = torch.linspace(-1, 1, 16)
    for ue8m0 in (False, True):
        x_q, _ = flashinfer.fp4_quantize(x, None, 16, ue8m0, False)
        assert int(x_q[0].sum()) == 0 and int(x_q[1, :8].sum()) == 0 and int(x_q[1, 8:].sum()) > 0


@pytest.mark.parametrize("m,k,block,ue8m0", [(5, 64, 16, False), (130, 96, 16, False),
                                             (9, 64, 32, True), (200, 160, 32, True)])
def test_swizzled_and_linear_layouts_hold_the_same_scales(m, k, block, ue8m0):
    torch.manual_seed(3)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    g = torch.tensor([448 * 6 / float(x.float().abs().max())])
    q_lin, lin = flashinfer.fp4_quantize(x, g, block, ue8m0, False)
    cols = k // block
    cp = -(-cols // 4) * 4
    for layout, eight in (("128x4", False), ("8x4", True)):
        q_sw, sw = flashinfer.fp4_quantize(x, g, block, ue8m0, True, eight)
        assert torch.equal(q_sw, q_lin)
        rows_padded = -(-m // (8 if eight else 128)) * (8 if eight else 128)
        assert sw.shape == (rows_padded, cp) and sw.dtype == lin.dtype
        flat, raw = sw.reshape(-1).view(torch.uint8), lin.view(torch.uint8)
        used = torch.zeros(flat.numel(), dtype=torch.bool)
        for r in range(m):
            for c in range(cols):
                off = offset(r, c, cols, layout)
                assert flat[off] == raw[r, c], (layout, r, c)
                used[off] = True
        assert int(flat[~used].sum()) == 0  # padding holds zeros
        assert len(set(offset(r, c, cp, layout) for r in range(rows_padded)
                       for c in range(cp))) == flat.numel()  # a bijection onto the storage
    inter = flashinfer.block_scale_interleave(lin)
    assert inter.dim() == 1 and torch.equal(inter.view(torch.uint8),
                                            flashinfer.fp4_quantize(x, g, block, ue8m0)[1]
                                            .reshape(-1).view(torch.uint8))
    assert flashinfer.nvfp4_block_scale_interleave is flashinfer.block_scale_interleave


def test_block_scale_interleave_batched():
    torch.manual_seed(4)
    sf = torch.randint(0, 255, (3, 10, 5), dtype=torch.uint8)
    out = flashinfer.block_scale_interleave(sf)
    assert out.shape == (3 * 128 * 8,)
    for e in range(3):
        part = out[e * 1024:(e + 1) * 1024]
        assert torch.equal(naive_unswizzle(part, 10, 5, "128x4"), sf[e])


def test_dequantiser_applies_global_scale_and_layouts():
    torch.manual_seed(5)
    x = torch.randn(17, 64)
    g = torch.tensor([448 * 6 / float(x.abs().max())])
    for eight in (False, True):
        x_q, sf = flashinfer.fp4_quantize(x, g, is_sf_8x4_layout=eight)
        got = flashinfer.e2m1_and_ufp8sf_scale_to_float(x_q, sf.view(torch.uint8).reshape(-1), g,
                                                        is_sf_8x4_layout=eight)
        want = naive_dequant(x_q, sf, 17, 16, "8x4" if eight else "128x4", False) / float(g)
        assert got.dtype == torch.float32 and rel_error(got, want) < 1e-6
        assert rel_error(got, x) < 0.12
    inv_q, inv_sf = flashinfer.fp4_quantize(x, 1 / g, is_global_scale_inversed=True)
    assert torch.equal(inv_q, flashinfer.fp4_quantize(x, g)[0])


def test_nvfp4_quantize_matches_fp4_quantize():
    torch.manual_seed(6)
    x = torch.randn(8, 32, dtype=torch.float16)
    g = torch.tensor([2.0])
    for layout in flashinfer.SfLayout:
        a = flashinfer.nvfp4_quantize(x, g, sfLayout=layout)
        b = flashinfer.fp4_quantize(x, g, 16, False, layout != flashinfer.SfLayout.layout_linear,
                                    layout == flashinfer.SfLayout.layout_8x4)
        assert torch.equal(a[0], b[0])
        assert torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8))


@pytest.mark.parametrize("call,name", [
    (lambda x: flashinfer.fp4_quantize(x.double()), "input"),
    (lambda x: flashinfer.fp4_quantize(x[0]), "input"),
    (lambda x: flashinfer.fp4_quantize(x, sf_vec_size=8), "sf_vec_size"),
    (lambda x: flashinfer.fp4_quantize(x[:, :40]), "sf_vec_size"),
    (lambda x: flashinfer.fp4_quantize(x, backend="nope"), "backend"),
    (lambda x: flashinfer.fp4_quantize(x, torch.ones(2)), "global_scale"),
    (lambda x: flashinfer.nvfp4_quantize(x, 1.0, sfLayout=7), "sfLayout"),
    (lambda x: flashinfer.nvfp4_quantize(x, 1.0, do_shuffle=True), "do_shuffle"),
    (lambda x: flashinfer.mxfp4_dequantize(torch.zeros(4, 16, dtype=torch.uint8),
                                           torch.zeros(4, 1, dtype=torch.uint8)), "a_sf"),
    (lambda x: flashinfer.e2m1_and_ufp8sf_scale_to_float(x, x), "e2m1_tensor"),
])
def test_quantiser_bad_input(call, name):
    x = torch.randn(4, 64)
    with pytest.raises((ValueError, TypeError)) as info:
        call(x)
    assert name in str(info.value)


# --------------------------------------------------------------------------------------------
# mm_fp4


def _operands(m, n, k, nvfp4=True, eight=False, seed=0, device="cpu"):
    torch.manual_seed(seed)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(n, k, dtype=torch.bfloat16, device=device)
    if nvfp4:
        ga = torch.tensor([448 * 6 / float(x.float().abs().max())], device=device)
        gb = torch.tensor([448 * 6 / float(w.float().abs().max())], device=device)
        a, a_sf = flashinfer.fp4_quantize(x, ga, is_sf_8x4_layout=eight)
        b, b_sf = flashinfer.fp4_quantize(w, gb)
        alpha = (1.0 / (ga * gb)).float()
    else:
        a, a_sf = flashinfer.fp4_quantize(x, None, 32, True, True, eight)
        b, b_sf = flashinfer.mxfp4_quantize(w)
        alpha = None
    return dict(a=a, b=b.T, a_descale=a_sf, b_descale=b_sf.T, alpha=alpha,
                block_size=16 if nvfp4 else 32, use_nvfp4=nvfp4, use_8x4_sf_layout=eight), x, w


def _naive_mm(ops, m, n):
    block, ue8m0 = ops["block_size"], not ops["use_nvfp4"]
    a = naive_dequant(ops["a"], ops["a_descale"], m, block,
                      "8x4" if ops["use_8x4_sf_layout"] else "128x4", ue8m0)
    b = naive_dequant(ops["b"].T, ops["b_descale"].T, n, block, "128x4", ue8m0)
    out = a @ b.T
    return out * float(ops["alpha"]) if ops["alpha"] is not None else out


@pytest.mark.parametrize("m,n,k", [(5, 24, 64), (33, 40, 96), (130, 16, 128)])
@pytest.mark.parametrize("nvfp4,eight", [(True, False), (True, True), (False, False)])
def test_mm_fp4_reference_vs_float64(m, n, k, nvfp4, eight):
    if not nvfp4 and k % 32:
        pytest.skip("MXFP4 needs k multiple of 32")
    ops, x, w = _operands(m, n, k, nvfp4, eight, seed=m + n + k)
    out = poison(torch.empty(m, n, dtype=torch.bfloat16))
    res = flashinfer.mm_fp4(out=out, backend="reference", **ops)
    assert res is out
    want = _naive_mm(ops, m, n)
    assert rel_error(out, want) < TOLERANCE[torch.bfloat16]
    assert rel_error(out, x.double() @ w.double().T) < 0.2  # two FP4 operands


@pytest.mark.parametrize("nvfp4", [True, False])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_mm_fp4_torch_vs_reference(nvfp4, out_dtype):
    ops, _, _ = _operands(19, 48, 128, nvfp4, seed=7)
    ref = flashinfer.mm_fp4(out_dtype=out_dtype, backend="reference", **ops)
    out = poison(torch.empty(19, 48, dtype=out_dtype))
    with flashinfer.record_decisions() as log:
        flashinfer.mm_fp4(out=out, out_dtype=out_dtype, backend="torch", **ops)
    assert log[-1].name == "torch:dequant_mm"
    assert rel_error(out, ref) < TOLERANCE[out_dtype]


def test_mm_fp4_auto_on_cpu_is_reference_and_alpha_scales():
    ops, _, _ = _operands(8, 32, 64, seed=8)
    with flashinfer.record_decisions() as log:
        base = flashinfer.mm_fp4(**ops)
    assert log[-1].backend == "reference" and base.dtype == torch.bfloat16
    doubled = flashinfer.mm_fp4(**{**ops, "alpha": ops["alpha"] * 2})
    assert torch.equal(doubled.float(), base.float() * 2)  # exact: a power-of-two factor
    no_alpha = flashinfer.mm_fp4(**{**ops, "alpha": None})
    assert rel_error(no_alpha.double() * float(ops["alpha"]), base) < TOLERANCE[torch.bfloat16]


def test_mm_fp4_accepts_uint8_scale_bytes():
    ops, _, _ = _operands(4, 16, 64, seed=9)
    ref = flashinfer.mm_fp4(**ops)
    raw = {**ops, "a_descale": ops["a_descale"].view(torch.uint8),
           "b_descale": ops["b_descale"].view(torch.uint8)}
    assert torch.equal(flashinfer.mm_fp4(**raw), ref)


def _bad(ops, **change):
    return {**ops, **change}


@pytest.mark.parametrize("change,exc,name", [
    (lambda o: _bad(o, a=o["a"].to(torch.int8)), ValueError, "a"),
    (lambda o: _bad(o, a=o["a"].float()), ValueError, "a"),
    (lambda o: _bad(o, b=[1]), TypeError, "b"),
    (lambda o: _bad(o, b=o["b"][:-1]), ValueError, "b"),
    (lambda o: _bad(o, block_size=64), ValueError, "block_size"),
    (lambda o: _bad(o, block_size=32), ValueError, "use_nvfp4"),
    (lambda o: _bad(o, use_nvfp4=False), ValueError, "block_size"),
    (lambda o: _bad(o, a=o["a"][:, :28], b=o["b"][:28]), ValueError, "block_size"),
    (lambda o: _bad(o, a_descale=o["a_descale"][:, :3]), ValueError, "a_descale"),
    (lambda o: _bad(o, a_descale=o["a_descale"].float()), ValueError, "a_descale"),
    (lambda o: _bad(o, b_descale=o["b_descale"].T), ValueError, "b_descale"),
    (lambda o: _bad(o, b_descale=o["b_descale"][:, :8]), ValueError, "b_descale"),
    (lambda o: _bad(o, alpha=torch.ones(2)), ValueError, "alpha"),
    (lambda o: _bad(o, out_dtype=torch.float8_e4m3fn), ValueError, "out_dtype"),
    (lambda o: _bad(o, out=torch.empty(3, 3, dtype=torch.bfloat16)), ValueError, "out"),
    (lambda o: _bad(o, backend="b12x"), ValueError, "b12x"),
    (lambda o: _bad(o, backend="nope"), ValueError, "nope"),
])
def test_mm_fp4_bad_input(change, exc, name):
    ops, _, _ = _operands(6, 16, 64, seed=10)
    with pytest.raises(exc) as info:
        flashinfer.mm_fp4(**change(ops))
    assert name in str(info.value)


def test_mm_fp4_mxfp4_scales_must_be_uint8():
    ops, _, _ = _operands(6, 16, 64, nvfp4=False, seed=11)
    with pytest.raises(ValueError, match="a_descale"):
        flashinfer.mm_fp4(**_bad(ops, a_descale=ops["a_descale"].view(torch.float8_e4m3fn)))


@pytest.mark.parametrize("backend", ["cutlass", "cudnn", "trtllm", "cute-dsl"])
def test_mm_fp4_native_backends_are_refused_with_reasons(backend, monkeypatch):
    ops, _, _ = _operands(6, 16, 64, seed=12)
    monkeypatch.setenv("FLASHINFER_STRICT", "1")  # else upstream's kernel names fall through
    with pytest.raises(BackendUnavailableError) as info:
        flashinfer.mm_fp4(**_bad(ops, backend=backend))
    assert "mm_fp4" in str(info.value)


def test_mm_fp4_torch_compile_fullgraph():
    ops, _, _ = _operands(8, 24, 64, seed=13)

    def f(a, b, a_sf, b_sf, alpha):
        return flashinfer.mm_fp4(a, b, a_sf, b_sf, alpha) * 2

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    args = (ops["a"], ops["b"], ops["a_descale"], ops["b_descale"], ops["alpha"])
    assert torch.equal(compiled(*args), f(*args))


# --------------------------------------------------------------------------------------------
# decisions on simulated SMs


def _problem(sm, features=()):
    device = simulated(None if sm == "cpu" else sm)
    return Problem.make("mm_fp4", device, dtypes={"a": "uint8", "b": "uint8", "out": "bfloat16"},
                        shape={"m": 16, "n": 4096, "k": 4096}, features=features)


def _reasons(decision, name):
    return {r.field for c in decision.candidates if c.name == name for r in c.reasons}


@pytest.mark.parametrize("features", [(), ("mxfp4",)])
@pytest.mark.parametrize("sm", SMS)
def test_mm_fp4_decisions(sm, features):
    decision = select(_problem(sm, features), assume_installed=True)
    if sm == "cpu":
        assert decision.backend == "reference"
        assert decision.order == ("reference", "torch:dequant_mm")
        assert _reasons(decision, "cutlass") == {"planned", "device"}
    elif sm == "7.5":  # no bf16 cuBLAS GEMM: the dequant path is not declared there
        assert decision.backend == "reference"
        assert _reasons(decision, "torch:dequant_mm") == {"sm"}
        assert _reasons(decision, "cutlass") == {"planned", "sm"}
    else:
        assert decision.name == "torch:dequant_mm"
        assert decision.order == ("torch:dequant_mm", "reference")
        if sm in ("10.0", "12.0"):  # native FP4 SMs: declared, planned (no kernel wired)
            cand = next(c for c in decision.candidates if c.backend == "cutlass")
            assert [r.field for r in cand.reasons] == ["planned"] and cand.planned
            assert not cand.verified
        else:
            assert _reasons(decision, "cutlass") == {"planned", "sm"}


def test_mm_fp4_8x4_scales_are_not_served_by_cutlass():
    decision = select(_problem("10.0", ("sf_8x4",)), assume_installed=True)
    assert decision.name == "torch:dequant_mm"
    assert _reasons(decision, "cutlass") == {"planned", "feature"}


@pytest.mark.parametrize("sm", ["7.5", "8.0", "9.0", "10.0", "12.0"])
def test_mm_fp4_strict_mode_refuses_the_dequantise_path(sm):
    """FLASHINFER_STRICT=1 on a GPU refuses the reference and the torch dequantise path (its
    record says ``emulation = true``): no native FP4 kernel here; on CPU the reference runs."""
    with pytest.raises(StrictModeError, match="emulation" if sm != "7.5" else "reference"):
        select(_problem(sm), strict=True, assume_installed=True)
    assert select(_problem(sm), assume_installed=True).backend in ("torch", "reference")
    assert select(_problem("cpu"), strict=True, assume_installed=True).backend == "reference"


# --------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (100, 4096, 1024), (1024, 1024, 4096)])
@pytest.mark.parametrize("nvfp4", [True, False])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_mm_fp4_gpu_torch_vs_reference(m, n, k, nvfp4, out_dtype):
    ops, x, w = _operands(m, n, k, nvfp4, seed=m, device="cuda")
    ref = flashinfer.mm_fp4(out_dtype=out_dtype, backend="reference", **ops)
    out = poison(torch.empty(m, n, dtype=out_dtype, device="cuda"))
    with flashinfer.record_decisions() as log:
        flashinfer.mm_fp4(out=out, out_dtype=out_dtype, **ops)
    assert log[-1].name == "torch:dequant_mm"
    assert rel_error(out, ref) < TOLERANCE[out_dtype]
    assert rel_error(out, x.double() @ w.double().T) < 0.2
    assert not math.isnan(rel_error(ref, x.double() @ w.double().T))


def test_legacy_module_path_reexports_the_same_objects():
    import flashinfer.fp4_quantization as fp4q
    from flashinfer.quantization import fp4

    for name in fp4q.__all__:
        assert getattr(fp4q, name) is getattr(fp4, name)
