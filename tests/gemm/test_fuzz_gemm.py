"""Fuzz suite, dense GEMMs and quantisation: generated ``out=`` buffers that share memory with
an operand, a scale, ``alpha`` or ``bias`` must raise a ValueError naming both before anything
is written; generated valid calls (tiny shapes, empty dims, strided operands, NaN / inf /
extreme scales) must match float64 naive math on every backend that can serve the call (the
documented result for non-finite scales: IEEE propagation, NaN in, NaN out); the quantisers
reject a bad ``eps`` / global scale naming it, and turn non-finite blocks into NaN as
documented."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from flashinfer import dispatch
from flashinfer.quantization import fp4
from flashinfer import gemm as G
from flashinfer import quantization as Q
from flashinfer.dispatch import Problem
from flashinfer.gemm.checks import scale_feature

from conftest import FUZZ, TOLERANCE, raises_naming, usable_backends

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
TOLERANCE = {**TOLERANCE, E4M3: 5e-2, E5M2: 5e-2}
#: per-tensor scales / alpha: IEEE propagation through ``dot * scale`` (every backend applies a
#: per-tensor scale after the dot product)
EXTREME = [1e-30, 1e30, 3e38, 0.0, float("nan"), float("inf"), -float("inf")]
#: block scales multiply the operands before the sums (the reference dequantises first, Triton
#: scales each K step's dot), so only values that no order turns into inf or NaN differently
BLOCK_EXTREME = [1e-30, 1e30, 0.0, float("nan")]


# --------------------------------------------------------------------------------------------
# helpers


def backends_for(op: str, device: str, dtypes: dict, shape: dict, features=()) -> list[str]:
    """Every kernel usable for this call (the Problem the public function builds)."""
    shape = {k: (dispatch.length_bucket(v) if k in ("m", "batch") else v) for k, v in shape.items()}
    return usable_backends(Problem.make(op, torch.device(device), dtypes=dtypes, shape=shape,
                                        features=features))


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, tol_dtype) -> None:
    """NaN and inf where the float64 result rounded to ``actual``'s dtype has them; the finite
    rest within the tolerance of ``tol_dtype`` (relative Frobenius error)."""
    exp = expected.to(actual.dtype).double().cpu()
    act = actual.double().cpu()
    assert torch.equal(torch.isnan(act), torch.isnan(exp)), "NaN pattern differs"
    inf = torch.isinf(exp)
    assert torch.equal(act[inf], exp[inf]) and not torch.isinf(act[~inf]).any(), "inf differs"
    finite = torch.isfinite(exp)
    if finite.any():
        a, e = act[finite], exp[finite]
        err = float((a - e).norm() / e.norm().clamp_min(1e-30))
        assert err <= TOLERANCE[tol_dtype], f"relative error {err:.3g} > {TOLERANCE[tol_dtype]}"


def fp8(shape, dtype, g, device) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * 2).to(dtype).to(device)


def maybe_transposed(t: torch.Tensor, flip: bool) -> torch.Tensor:
    """``t`` itself, or the same values in the other memory order (a non-contiguous view)."""
    return t.t().contiguous().t() if flip else t


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


# --------------------------------------------------------------------------------------------
# out= sharing memory with a read argument


def carve(pool: torch.Tensor, offset: int, shape, dtype) -> torch.Tensor:
    """A contiguous ``shape`` tensor of ``dtype`` at byte ``offset`` of the uint8 ``pool``."""
    size = torch.empty((), dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    return pool[offset:offset + n * size].view(dtype).view(shape)


def alias_call(fn: str, victim: str, shift: int, device: str = "cpu"):
    """``(call, pool)``: ``fn`` called with its ``out`` carved from the first bytes of ``pool``
    and the argument ``victim`` from ``4 * shift`` bytes on (so the two overlap)."""
    g = torch.Generator().manual_seed(shift)
    pool = torch.zeros(1 << 14, dtype=torch.uint8, device=device)
    m, k, n = 4, 32, 16

    def arg(name, shape, dtype, make):
        value = make().to(device)
        if name != victim:
            return value
        t = carve(pool, 4 * shift, shape, dtype)
        t.copy_(value)
        return t

    out = carve(pool, 0, (m, n) if fn != "bmm_fp8" else (1, m, n), torch.bfloat16)
    one = lambda: torch.ones(1)  # noqa: E731
    if fn == "mm_bf16":
        a = arg("a", (m, k), torch.bfloat16, lambda: torch.randn(m, k, generator=g).bfloat16())
        b = arg("b", (k, n), torch.bfloat16, lambda: torch.randn(k, n, generator=g).bfloat16())
        bias = arg("bias", (n,), torch.bfloat16, lambda: torch.randn(n, generator=g).bfloat16())
        return (lambda: G.mm_bf16(a, b, bias, out=out)), pool
    if fn == "bmm_fp8":
        A = arg("A", (1, m, k), E4M3, lambda: fp8((1, m, k), E4M3, g, "cpu"))
        B = arg("B", (1, k, n), E4M3, lambda: fp8((1, k, n), E4M3, g, "cpu"))
        sa = arg("A_scale", (1,), torch.float32, one)
        sb = arg("B_scale", (1,), torch.float32, one)
        return (lambda: G.bmm_fp8(A, B, sa, sb, torch.bfloat16, out=out)), pool
    if fn == "mm_fp8":
        a = arg("a", (m, k), E4M3, lambda: fp8((m, k), E4M3, g, "cpu"))
        b = arg("b", (n, k), E4M3, lambda: fp8((n, k), E4M3, g, "cpu"))
        alpha = arg("alpha", (1,), torch.float32, one)
        return (lambda: G.mm_fp8(a, b, alpha, out=out)), pool
    if fn == "gemm_fp8_nt_groupwise":
        a = arg("a", (m, k), E4M3, lambda: fp8((m, k), E4M3, g, "cpu"))
        b = arg("b", (n, k), E4M3, lambda: fp8((n, k), E4M3, g, "cpu"))
        sa = arg("a_scale", (m, 1), torch.float32, lambda: torch.ones(m, 1))
        sb = arg("b_scale", (1, 1), torch.float32, lambda: torch.ones(1, 1))
        return (lambda: G.gemm_fp8_nt_groupwise(a, b, sa, sb, out=out)), pool
    codes = lambda rows: torch.randint(  # noqa: E731
        0, 255, (rows, k // 2), generator=g, dtype=torch.uint8)
    unit = lambda: torch.full((128, 4), 0x38, dtype=torch.uint8)  # noqa: E731  e4m3 1.0
    a = arg("a", (m, k // 2), torch.uint8, lambda: codes(m))
    w = arg("b", (n, k // 2), torch.uint8, lambda: codes(n))
    sa = arg("a_descale", (128, 4), torch.uint8, unit)
    sw = arg("b_descale", (128, 4), torch.uint8, unit)
    alpha = arg("alpha", (1,), torch.float32, one)
    return (lambda: G.mm_fp4(a, w.t(), sa, sw.t(), alpha, out=out)), pool


ALIAS_VICTIMS = {
    "mm_bf16": ["a", "b", "bias"], "bmm_fp8": ["A", "B", "A_scale", "B_scale"],
    "mm_fp8": ["a", "b", "alpha"], "gemm_fp8_nt_groupwise": ["a", "b", "a_scale", "b_scale"],
    "mm_fp4": ["a", "b", "a_descale", "b_descale", "alpha"],
}


@FUZZ
@given(data=st.data(), fn=st.sampled_from(sorted(ALIAS_VICTIMS)), shift=st.integers(0, 7))
def test_out_sharing_memory_with_an_input_raises_naming_both(data, fn, shift):
    victim = data.draw(st.sampled_from(ALIAS_VICTIMS[fn]))
    call, pool = alias_call(fn, victim, shift)
    before = pool.clone()
    with raises_naming(fn + ":", "out shares memory with " + victim):
        call()
    assert torch.equal(pool, before)  # raised before any kernel wrote


def test_out_exactly_an_operand_raises():
    """Even the very same tensor: a tiled GEMM overwrites ``a`` while it still reads it."""
    a, b = torch.randn(4, 4).bfloat16(), torch.randn(4, 4).bfloat16()
    with raises_naming("mm_bf16", "out shares memory with a"):
        G.mm_bf16(a, b, out=a)


# --------------------------------------------------------------------------------------------
# valid calls vs float64 naive math


@st.composite
def mm_bf16_cases(draw):
    return {"m": draw(st.integers(0, 4)), "k": draw(st.integers(0, 5)),
            "n": draw(st.integers(0, 5)),
            "bias": draw(st.booleans()), "out_dtype": draw(st.sampled_from(
                [torch.bfloat16, torch.float16, torch.float32])),
            "given": draw(st.booleans()), "flip": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**16))}


def run_mm_bf16(case, device):
    g = torch.Generator().manual_seed(case["seed"])
    m, k, n = case["m"], case["k"], case["n"]
    a = torch.randn(m, k, generator=g).bfloat16().to(device)
    b = maybe_transposed(torch.randn(k, n, generator=g).bfloat16().to(device), case["flip"])
    bias = torch.randn(n, generator=g).bfloat16().to(device) if case["bias"] else None
    want = a.double() @ b.double() + (bias.double() if bias is not None else 0)
    dtypes = {"a": torch.bfloat16, "b": torch.bfloat16, "out": case["out_dtype"]}
    features = ("bias",) if bias is not None else ()
    for backend in backends_for("mm_bf16", device, dtypes, {"m": m, "n": n, "k": k}, features):
        out = poisoned((m, n), case["out_dtype"], device) if case["given"] else None
        got = G.mm_bf16(a, b, bias, out=out, out_dtype=case["out_dtype"], backend=backend)
        assert got.shape == (m, n) and (out is None or got is out)
        assert_matches(got, want, torch.bfloat16)


@FUZZ
@given(case=mm_bf16_cases())
def test_mm_bf16_matches_float64(case):
    run_mm_bf16(case, "cpu")


@st.composite
def fp8_cases(draw):
    scale = draw(st.sampled_from(["normal"] * 3 + ["extreme"]))
    which = draw(st.integers(0, 1))
    scales = [draw(st.floats(0.25, 4.0)), draw(st.floats(0.25, 4.0))]
    if scale == "extreme":  # one scale extreme, the other 1 (no intermediate overflow order)
        scales = [1.0, 1.0]
        scales[which] = draw(st.sampled_from(EXTREME))
    return {"batch": draw(st.integers(1, 2)), "m": draw(st.integers(0, 3)),
            "k": draw(st.sampled_from([0, 1, 16, 33])), "n": draw(st.integers(0, 17)),
            "dtype": draw(st.sampled_from([E4M3, E5M2])),
            "out_dtype": draw(st.sampled_from([torch.bfloat16, torch.float16])),
            "scales": scales, "given": draw(st.booleans()), "flip": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**16))}


def run_bmm_fp8(case, device):
    g = torch.Generator().manual_seed(case["seed"])
    bt, m, k, n, dt = case["batch"], case["m"], case["k"], case["n"], case["dtype"]
    A = fp8((bt, m, k), dt, g, device)
    B = fp8((bt, k, n), dt, g, device)
    if case["flip"]:
        B = B.transpose(1, 2).contiguous().transpose(1, 2)
    sa, sb = (torch.tensor([s], dtype=torch.float32, device=device) for s in case["scales"])
    want = torch.bmm(A.double(), B.double())
    if k:  # k = 0: documented zeros, scales not read
        want = want * float(sa) * float(sb)
    dtypes = {"a": dt, "b": dt, "out": case["out_dtype"]}
    for backend in backends_for("bmm_fp8", device, dtypes, {"batch": bt, "m": m, "n": n, "k": k}):
        out = poisoned((bt, m, n), case["out_dtype"], device) if case["given"] else None
        got = G.bmm_fp8(A, B, sa, sb, case["out_dtype"], out=out, backend=backend)
        assert got.shape == (bt, m, n)
        assert_matches(got, want, dt)


def run_mm_fp8(case, device):
    g = torch.Generator().manual_seed(case["seed"])
    m, k, n, dt = case["m"], case["k"], case["n"], case["dtype"]
    a = fp8((m, k), dt, g, device)
    b = maybe_transposed(fp8((n, k), dt, g, device), case["flip"])
    alpha = torch.tensor([case["scales"][0]], device=device)
    want = a.double() @ b.double().t() * (float(alpha) if k else 0.0)
    dtypes = {"a": dt, "b": dt, "out": torch.bfloat16}
    for backend in backends_for("bmm_fp8", device, dtypes, {"batch": 1, "m": m, "n": n, "k": k}):
        out = poisoned((m, n), torch.bfloat16, device) if case["given"] else None
        assert_matches(G.mm_fp8(a, b, alpha, out=out, backend=backend), want, dt)


@FUZZ
@given(case=fp8_cases())
def test_bmm_fp8_matches_float64(case):
    run_bmm_fp8(case, "cpu")


@FUZZ
@given(case=fp8_cases())
def test_mm_fp8_matches_float64(case):
    run_mm_fp8(case, "cpu")


GRANULARITIES = [(1, 128, 128), (128, 128, 128), (1, 1, 160), (1, 1, 1000), (2, 8, 16)]


@st.composite
def groupwise_cases(draw):
    case = draw(fp8_cases())
    case["extreme"] = draw(st.sampled_from([None] + BLOCK_EXTREME))
    case["granularity"] = draw(st.sampled_from(GRANULARITIES))
    case["k"] = draw(st.sampled_from([0, 1, 100, 160, 257]))
    case["mode"] = draw(st.sampled_from(["K", "MN"]))
    return case


def run_groupwise(case, device):
    g = torch.Generator().manual_seed(case["seed"])
    m, k, n, dt = case["m"], case["k"], case["n"], case["dtype"]
    gm, gn, gk = case["granularity"]
    a = fp8((m, k), dt, g, device)
    b = fp8((n, k), dt, g, device)
    rows_a, rows_b, cols = -(-m // gm), -(-n // gn), -(-k // gk)
    sa = (torch.rand(rows_a, cols, generator=g) + 0.5).to(device)
    sb = (torch.rand(rows_b, cols, generator=g) + 0.5).to(device)
    if rows_a and cols and case["extreme"] is not None:
        sa[0, 0] = case["extreme"]  # one block of a's scales gets the drawn value
    full_a = sa.double().cpu().repeat_interleave(gm, 0).repeat_interleave(gk, 1)[:m, :k]
    full_b = sb.double().cpu().repeat_interleave(gn, 0).repeat_interleave(gk, 1)[:n, :k]
    want = (a.double().cpu() * full_a) @ (b.double().cpu() * full_b).t()
    if case["mode"] == "MN":
        sa, sb = sa.t().contiguous(), sb.t().contiguous()
    gran = (gm, gn, gk)
    feature = scale_feature(gran, k)
    dtypes = {"a": dt, "b": dt, "out": case["out_dtype"]}
    for backend in backends_for("gemm_fp8_groupwise", device, dtypes, {"m": m, "n": n, "k": k},
                                (feature,)):
        out = poisoned((m, n), case["out_dtype"], device) if case["given"] else None
        got = G.gemm_fp8_nt_groupwise(a, b, sa, sb, case["mode"], 1, gran, out=out,
                                      out_dtype=case["out_dtype"], backend=backend)
        assert_matches(got, want, dt)


@FUZZ
@given(case=groupwise_cases())
def test_gemm_fp8_groupwise_matches_float64(case):
    run_groupwise(case, "cpu")


_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def dequant_fp4(packed: torch.Tensor, sf_linear: torch.Tensor, block: int) -> torch.Tensor:
    """Packed e2m1 ``[R, K/2]`` and linear scales ``[R, K/block]`` -> float64 ``[R, K]``
    (written from the format's definition: low nibble first, bit 3 the sign)."""
    p = packed.cpu().long()
    codes = torch.stack((p & 0xF, p >> 4), -1).reshape(p.shape[0], -1)
    mag = torch.tensor(_E2M1, dtype=torch.float64)[codes & 7]
    values = torch.where(codes >= 8, -mag, mag)
    if block == 32:  # UE8M0: 2 ** (e - 127), 255 is NaN
        e = sf_linear.cpu().view(torch.uint8).double()
        scale = torch.where(e == 255, float("nan"), torch.exp2(e - 127))
    else:
        scale = sf_linear.cpu().view(E4M3).double()
    return values * scale.repeat_interleave(block, 1)


@st.composite
def fp4_cases(draw):
    nv = draw(st.booleans())
    return {"nvfp4": nv, "m": draw(st.integers(1, 5)), "n": draw(st.integers(1, 6)),
            "k": draw(st.sampled_from([16, 32, 64]) if nv else st.sampled_from([32, 64])),
            "alpha": draw(st.sampled_from([None, 0.5, 1e-30, 1e30, float("nan"), float("inf")])),
            "eight": draw(st.booleans()), "out_dtype": draw(st.sampled_from(
                [torch.bfloat16, torch.float16])), "given": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**16))}


def run_mm_fp4(case, device):
    g = torch.Generator().manual_seed(case["seed"])
    m, n, k, nv = case["m"], case["n"], case["k"], case["nvfp4"]
    block = 16 if nv else 32
    x = torch.randn(m, k, generator=g).bfloat16().to(device)
    w = torch.randn(n, k, generator=g).bfloat16().to(device)
    if nv:
        gx, gw = (torch.tensor([448 * 6 / float(t.abs().max())], device=device) for t in (x, w))
        layout_a = fp4.SfLayout.layout_8x4 if case["eight"] else fp4.SfLayout.layout_128x4
        xq, xs = fp4.nvfp4_quantize(x, gx, sfLayout=layout_a)
        wq, ws = fp4.nvfp4_quantize(w, gw)
        xs_lin = fp4.nvfp4_quantize(x, gx, sfLayout=fp4.SfLayout.layout_linear)[1]
        ws_lin = fp4.nvfp4_quantize(w, gw, sfLayout=fp4.SfLayout.layout_linear)[1]
    else:
        layout_a = fp4.SfLayout.layout_8x4 if case["eight"] else fp4.SfLayout.layout_128x4
        xq, xs = fp4.mxfp4_quantize(x, sfLayout=layout_a)
        wq, ws = fp4.mxfp4_quantize(w)
        xs_lin = fp4.mxfp4_quantize(x, sfLayout=fp4.SfLayout.layout_linear)[1]
        ws_lin = fp4.mxfp4_quantize(w, sfLayout=fp4.SfLayout.layout_linear)[1]
    alpha = None if case["alpha"] is None else torch.tensor([case["alpha"]], device=device)
    want = dequant_fp4(xq, xs_lin, block) @ dequant_fp4(wq, ws_lin, block).t()
    if alpha is not None:
        want = want * case["alpha"]
    features = (("mxfp4",) if not nv else ()) + (("sf_8x4",) if case["eight"] else ())
    dtypes = {"a": torch.uint8, "b": torch.uint8, "out": case["out_dtype"]}
    for backend in backends_for("mm_fp4", device, dtypes, {"m": m, "n": n, "k": k}, features):
        out = poisoned((m, n), case["out_dtype"], device) if case["given"] else None
        got = G.mm_fp4(xq, wq.t(), xs, ws.t(), alpha, case["out_dtype"], out, block,
                       case["eight"], backend, nv)
        assert_matches(got, want, torch.bfloat16)


@FUZZ
@given(case=fp4_cases())
def test_mm_fp4_matches_float64(case):
    run_mm_fp4(case, "cpu")


# --------------------------------------------------------------------------------------------
# quantisers


FP8_DST = [E4M3, E5M2, torch.int8]
#: |x - dequant(x)| <= REL * |x| + ABS * scale (half a step of the destination format)
_STEP = {E4M3: (2.0 ** -4, 2.0 ** -10), E5M2: (2.0 ** -3, 2.0 ** -17), torch.int8: (0.0, 0.5)}


@st.composite
def quant_cases(draw):
    return {"fn": draw(st.sampled_from(["per_tensor", "per_token", "blockwise", "group"])),
            "m": draw(st.integers(0, 4)), "k": draw(st.sampled_from([0, 1, 8, 130])),
            "dtype": draw(st.sampled_from(FP8_DST)), "src": draw(st.sampled_from(
                [torch.float32, torch.bfloat16])),
            "poison": draw(st.sampled_from([None, float("nan"), float("inf")])),
            "block": draw(st.sampled_from([(1, 128), (128, 128), (2, 3)])),
            "magnitude": draw(st.sampled_from([1.0, 1e-20, 1e20])),
            "seed": draw(st.integers(0, 2**16))}


def quantize(case, x):
    """``(x_q, scale broadcast to x's shape as float64)``."""
    fn, dt = case["fn"], case["dtype"]
    m, k = x.shape
    if fn == "per_tensor":
        q, s = Q.quantize_fp8_per_tensor(x, dt)
        assert s.shape == ()
        return q, s.double().expand(m, k)
    if fn == "per_token":
        q, s = Q.quantize_fp8_per_token(x, dt)
        assert s.shape == (m, 1)
        return q, s.double().expand(m, k)
    if fn == "blockwise":
        bm, bk = case["block"]
        q, s = Q.quantize_fp8_blockwise(x, case["block"], dt)
        assert s.shape == (-(-m // bm), -(-k // bk))
        return q, s.double().repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:m, :k]
    group = 2 if k % 2 == 0 else 1
    q, s = Q.per_token_group_quant_8bit(x, group, dst_dtype=dt)
    assert s.shape == (m, k // group)
    return q, s.double().repeat_interleave(group, 1)


@FUZZ
@given(case=quant_cases())
def test_fp8_quantisers_round_trip_and_propagate_non_finite_blocks(case):
    g = torch.Generator().manual_seed(case["seed"])
    x = (torch.randn(case["m"], case["k"], generator=g) * case["magnitude"]).to(case["src"])
    if case["poison"] is not None and x.numel():
        x[0, 0] = case["poison"]
    q, scale = quantize(case, x)
    assert q.dtype == case["dtype"] and q.shape == x.shape
    deq = q.double() * scale
    xd = x.double()
    if case["poison"] is not None and x.numel():
        # the poisoned block: its scale is NaN / inf, every element dequantises to NaN
        block = torch.isnan(scale) | torch.isinf(scale)
        assert block[0, 0] and torch.isnan(deq[block]).all()
        keep = ~block
    else:
        keep = torch.ones_like(xd, dtype=torch.bool)
    rel, absolute = _STEP[case["dtype"]]
    bound = rel * xd.abs() + absolute * scale + 1e-6 * xd.abs()
    assert ((deq - xd).abs() <= bound)[keep].all()


@FUZZ
@given(fn=st.sampled_from(["per_tensor", "per_token", "blockwise", "group"]),
       eps=st.sampled_from([0.0, -1e-10, float("nan"), float("inf"), -float("inf")]))
def test_fp8_quantisers_reject_bad_eps(fn, eps):
    x = torch.randn(2, 8)
    call = {"per_tensor": lambda: Q.quantize_fp8_per_tensor(x, eps=eps),
            "per_token": lambda: Q.quantize_fp8_per_token(x, eps=eps),
            "blockwise": lambda: Q.quantize_fp8_blockwise(x, eps=eps),
            "group": lambda: Q.per_token_group_quant_8bit(x, 4, eps=eps)}[fn]
    with raises_naming("eps"):
        call()


@FUZZ
@given(value=st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.0, -2.0]),
       as_tensor=st.booleans(), inversed=st.booleans(),
       fn=st.sampled_from(["fp4_quantize", "nvfp4_quantize", "dequantize"]))
def test_fp4_bad_global_scale_on_the_host_raises_naming_it(value, as_tensor, inversed, fn):
    x = torch.randn(2, 32)
    gs = torch.tensor([value]) if as_tensor else value
    if fn == "fp4_quantize":
        name = "global_scale"
        call = lambda: fp4.fp4_quantize(x, gs, is_global_scale_inversed=inversed)  # noqa: E731
    elif fn == "nvfp4_quantize":
        call, name = lambda: fp4.nvfp4_quantize(x, torch.tensor([value])), "a_global_sf"
    else:
        q, s = fp4.fp4_quantize(x, 1.0)
        call = lambda: fp4.e2m1_and_ufp8sf_scale_to_float(q, s, torch.tensor([value]))  # noqa: E731
        name = "global_scale_tensor"
    with raises_naming(name):
        call()


@FUZZ
@given(nvfp4=st.booleans(), poison=st.sampled_from([float("nan"), float("inf"), -float("inf")]),
       m=st.integers(1, 3), blocks=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_fp4_non_finite_blocks_follow_the_documented_rule(nvfp4, poison, m, blocks, seed):
    block = 16 if nvfp4 else 32
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, blocks * block, generator=g)
    x[0, 1] = poison
    layout = fp4.SfLayout.layout_linear
    q, s = (fp4.nvfp4_quantize(x, torch.tensor([1.0]), sfLayout=layout) if nvfp4
            else fp4.mxfp4_quantize(x, sfLayout=layout))
    deq = dequant_fp4(q, s, block)
    first = deq[0, :block]
    if poison != poison:  # NaN: the whole block dequantises to NaN
        assert torch.isnan(first).all()
    else:  # inf saturates: the largest code of the block's (saturated) scale, same sign
        assert first[1] == (6.0 if poison > 0 else -6.0) * (448.0 if nvfp4 else 2.0 ** 127)
        assert torch.isfinite(first).all()
    assert torch.isfinite(deq[1:]).all() and torch.isfinite(deq[0, block:]).all()


# --------------------------------------------------------------------------------------------
# GPU: the same generated calls over every backend usable on the device


@pytest.mark.gpu
@FUZZ
@given(case=mm_bf16_cases())
def test_gpu_mm_bf16_matches_float64(case):
    run_mm_bf16(case, "cuda")


@pytest.mark.gpu
@FUZZ
@given(case=fp8_cases())
def test_gpu_bmm_fp8_matches_float64(case):
    run_bmm_fp8(case, "cuda")


@pytest.mark.gpu
@FUZZ
@given(case=fp8_cases())
def test_gpu_mm_fp8_matches_float64(case):
    run_mm_fp8(case, "cuda")


@pytest.mark.gpu
@FUZZ
@given(case=groupwise_cases())
def test_gpu_gemm_fp8_groupwise_matches_float64(case):
    run_groupwise(case, "cuda")


@pytest.mark.gpu
@FUZZ
@given(case=fp4_cases())
def test_gpu_mm_fp4_matches_float64(case):
    run_mm_fp4(case, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("fn,victim", [(f, v) for f in sorted(ALIAS_VICTIMS)
                                       for v in ALIAS_VICTIMS[f]])
def test_gpu_out_sharing_memory_with_an_input_raises(fn, victim):
    call, pool = alias_call(fn, victim, 3, "cuda")
    before = pool.clone()
    with raises_naming(fn + ":", "out shares memory with " + victim):
        call()
    assert torch.equal(pool, before)
