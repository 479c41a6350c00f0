"""GEMM dispatch decisions on simulated SMs (no GPU needed) and on the CPU.

fp8 rules (dispatch_rules/bmm_fp8.toml, gemm_fp8_groupwise.toml, H200 2026-11-30): torch
(cuBLASLt ``_scaled_mm``) leads wherever it serves; triton (verified on SM 9.0) serves what torch
refuses, ahead of the fp32-dequantising reference; the reference is left only where neither can.
"""

import pytest

from flashinfer.device import simulated
from flashinfer.dispatch import Problem, StrictModeError, select

SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]
E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"


def _device(sm):
    return simulated(None if sm == "cpu" else sm)


def _mm_bf16(sm, out="bfloat16", **shape):
    facts = {"m": 16, "n": 8192, "k": 8192, **shape}
    return Problem.make("mm_bf16", _device(sm), dtypes={"a": "bfloat16", "b": "bfloat16",
                                                         "out": out}, shape=facts)


def _bmm_fp8(sm, a=E4M3, b=E4M3, **shape):
    facts = {"batch": 1, "m": 16, "n": 8192, "k": 8192, **shape}
    return Problem.make("bmm_fp8", _device(sm), dtypes={"a": a, "b": b, "out": "bfloat16"},
                        shape=facts)


def _groupwise(sm, feature, out="bfloat16", **shape):
    facts = {"m": 16, "n": 8192, "k": 8192, **shape}
    return Problem.make("gemm_fp8_groupwise", _device(sm),
                        dtypes={"a": E4M3, "b": E4M3, "out": out}, shape=facts,
                        features=[feature])


def _reasons(decision, name):
    return {r.field for c in decision.candidates if c.name == name for r in c.reasons}


@pytest.mark.parametrize("sm", SMS)
def test_mm_bf16(sm):
    decision = select(_mm_bf16(sm), assume_installed=True)
    if sm == "7.5":
        assert decision.backend == "reference"
        assert _reasons(decision, "torch") == {"sm"}
    elif sm == "cpu":  # the fp32 reference first: a CPU without bf16 instructions emulates torch.mm
        assert decision.backend == "reference"
        assert decision.order == ("reference", "torch")
    else:  # torch.mm: cuBLAS on every SM from 8.0; CUTLASS on 8.x-9.0
        assert decision.backend == "torch"
        cutlass_sm = sm in ("8.0", "8.6", "8.9", "9.0")
        assert decision.order == (("torch", "cudnn", "cutlass", "reference") if cutlass_sm else
                                  ("torch", "cudnn", "reference"))


@pytest.mark.parametrize("sm", SMS)
def test_bmm_fp8_per_tensor(sm):
    decision = select(_bmm_fp8(sm), assume_installed=True)
    if sm in ("8.9", "9.0", "10.0", "12.0"):  # torch leads, triton next, reference last
        assert decision.name == "torch:scaled_mm"
        cutlass = ("cutlass",) if sm == "9.0" else ()  # its fp8 kernels: SM 9.0 only
        assert decision.order == ("torch:scaled_mm", "triton", "cudnn", *cutlass, "reference")
    else:  # neither fp8 kernel runs below SM 8.9 (or on the CPU without TRITON_INTERPRET)
        assert decision.backend == "reference"
        why = {"device"} if sm == "cpu" else {"sm"}
        assert _reasons(decision, "torch:scaled_mm") == why
        assert _reasons(decision, "triton") == why


@pytest.mark.parametrize("sm", ["8.9", "9.0", "10.0"])
@pytest.mark.parametrize("batch", [2, 128])
def test_batched_bmm_fp8_prefers_one_launch_on_sm90(sm, batch):
    """torch loops _scaled_mm over the batch (128 launches at DeepSeek-V3's MLA shapes: 370-470
    us on the H200 against 6-76 for Triton's one launch): batched calls go to triton on SM 9.0,
    where that was measured; batch 1 (mm_fp8) stays with cuBLASLt."""
    decision = select(_bmm_fp8(sm, batch=batch, n=512, k=128), assume_installed=True)
    if sm == "9.0":
        assert decision.order[:3] == ("triton", "cudnn", "torch:scaled_mm")
    else:
        assert decision.name == "torch:scaled_mm"
    single = select(_bmm_fp8(sm, n=512, k=128), assume_installed=True)
    assert single.name == "torch:scaled_mm"


@pytest.mark.parametrize("m, first", [(128, "triton"), (512, "triton"), (1024, "cudnn"),
                                      (8192, "cudnn")])
def test_long_batched_bmm_fp8_prefers_cudnn_on_sm90(m, first):
    """At M = 1,024 (batch 128) cuDNN's graph took 52 / 35 us against Triton's 74 / 39."""
    from flashinfer.dispatch import length_bucket

    decision = select(_bmm_fp8("9.0", batch=128, m=length_bucket(m), n=512, k=128),
                      assume_installed=True)
    assert decision.backend == first


@pytest.mark.parametrize("k,n,field", [(8200, 8192, "k"), (8192, 8200, "n")])
def test_bmm_fp8_misaligned_goes_to_triton(k, n, field):
    """cuBLASLt needs K and N multiples of 16; triton masks its tiles, so it serves them
    (CUTLASS's fp8 kernels take N a multiple of 8, K of 16)."""
    decision = select(_bmm_fp8("9.0", k=k, n=n), assume_installed=True)
    assert decision.backend == "triton"
    assert decision.order == (("triton", "cutlass", "reference") if field == "n" else
                              ("triton", "reference"))
    assert _reasons(decision, "torch:scaled_mm") == {field}
    assert _reasons(decision, "triton") == set()


def test_bmm_fp8_e5m2_pairs():
    """e4m3 x e5m2 (either way round) is torch's; e5m2 x e5m2, which cuBLASLt refuses, is
    triton's; triton refuses the mixed pair."""
    mixed = select(_bmm_fp8("9.0", a=E5M2), assume_installed=True)
    assert mixed.name == "torch:scaled_mm"
    assert _reasons(mixed, "triton") == {"dtype.b"}
    decision = select(_bmm_fp8("9.0", a=E5M2, b=E5M2), assume_installed=True)
    assert decision.backend == "triton"
    assert decision.order == ("triton", "cudnn", "reference")
    assert _reasons(decision, "torch:scaled_mm") == {"dtype.b"}
    assert _reasons(decision, "triton") == set()


def _below_sm89(decision, sm):
    """Below SM 8.9 (and on the CPU) no fp8 kernel runs: the reference, with the reason."""
    assert decision.backend == "reference"
    assert decision.order == ("reference",)
    assert _reasons(decision, "triton") == ({"device"} if sm == "cpu" else {"sm"})


@pytest.mark.parametrize("sm", SMS)
def test_groupwise_rowwise(sm):
    decision = select(_groupwise(sm, "scale_rowwise"), assume_installed=True)
    if sm in ("9.0", "10.0", "12.0"):  # torch leads where it serves, triton next
        assert decision.name == "torch:scaled_mm_rowwise"
        assert decision.order == ("torch:scaled_mm_rowwise", "triton", "reference")
    elif sm == "8.9":  # cuBLASLt's row-wise recipe needs SM 9.0; triton serves SM 8.9
        assert decision.backend == "triton"
        assert decision.order == ("triton", "reference")
        assert _reasons(decision, "torch:scaled_mm_rowwise") == {"sm"}
    else:
        _below_sm89(decision, sm)
        assert _reasons(decision, "torch:scaled_mm_rowwise") == (
            {"device"} if sm == "cpu" else {"sm"})


def test_groupwise_rowwise_fp16_out_goes_to_triton():
    """cuBLASLt's row-wise recipe writes bfloat16 only; triton writes float16 too."""
    decision = select(_groupwise("9.0", "scale_rowwise", out="float16"), assume_installed=True)
    assert decision.backend == "triton"
    assert decision.order == ("triton", "reference")
    assert _reasons(decision, "torch:scaled_mm_rowwise") == {"dtype.out"}
    assert _reasons(decision, "triton") == set()


@pytest.mark.parametrize("sm", SMS)
def test_groupwise_1x128(sm):
    decision = select(_groupwise(sm, "scale_1x128"), assume_installed=True)
    if sm == "9.0":  # cuBLASLt's block-wise recipe exists on SM 9.0 only; torch leads there
        assert decision.name == "torch:scaled_mm_blockwise"
        assert decision.order == ("torch:scaled_mm_blockwise", "triton", "reference")
    elif sm in ("8.9", "10.0", "12.0"):  # no cuBLASLt block-wise: triton serves
        assert decision.backend == "triton"
        assert decision.order == ("triton", "reference")
        assert _reasons(decision, "torch:scaled_mm_blockwise") == {"sm"}
    else:
        _below_sm89(decision, sm)
        assert _reasons(decision, "torch:scaled_mm_blockwise") == (
            {"device"} if sm == "cpu" else {"sm"})
    assert "feature" in _reasons(decision, "torch:scaled_mm_rowwise")


@pytest.mark.parametrize("k,n,field", [(7168 + 64, 2048, "k"), (7168, 2048 + 8, "n"),
                                       (896, 2048, "k"), (640, 2048, "k")])
def test_groupwise_1x128_misaligned_goes_to_triton(k, n, field):
    """K not a multiple of 512 (a scale-block count not a multiple of 4: cuBLASLt computes
    wrong values there) or N not a multiple of 16: triton serves."""
    decision = select(_groupwise("9.0", "scale_1x128", k=k, n=n), assume_installed=True)
    assert decision.backend == "triton"
    assert decision.order == ("triton", "reference")
    assert _reasons(decision, "torch:scaled_mm_blockwise") == {field}
    assert _reasons(decision, "triton") == set()


@pytest.mark.parametrize("m,n,k,chosen", [
    (1, 36864, 7168, "triton"), (16, 36864, 7168, "triton"),          # DeepSeek-V3 gate_up
    (32, 36864, 7168, "torch:scaled_mm_blockwise"),                   # past decode sizes
    (16, 57344, 8192, "torch:scaled_mm_blockwise"),                   # Llama-3.1-70B gate_up
    (16, 7168, 18432, "torch:scaled_mm_blockwise"),                   # narrow N
])
def test_groupwise_1x128_decode_rule_on_sm90(m, n, k, chosen):
    """SM 9.0's decode_wide_k7168_prefers_triton: Triton 1.1-1.25x cuBLASLt at DeepSeek-V3's
    gate_up for M <= 16, not elsewhere."""
    decision = select(_groupwise("9.0", "scale_1x128", m=m, n=n, k=k), assume_installed=True)
    assert decision.name == chosen
    assert (decision.rule == "decode_wide_k7168_prefers_triton") == (chosen == "triton")


def test_groupwise_1x128_partial_weight_block_stays_on_cublaslt():
    """N a multiple of 16 but not of 128 (DeepSeek-V3 kv_a, N = 576): cuBLASLt takes it."""
    decision = select(_groupwise("9.0", "scale_1x128", k=7168, n=576), assume_installed=True)
    assert decision.name == "torch:scaled_mm_blockwise"


@pytest.mark.parametrize("sm", SMS)
def test_groupwise_128x128_is_triton_only(sm):
    """128x128 activation blocks: no cuBLASLt recipe; triton from SM 8.9, else the reference."""
    decision = select(_groupwise(sm, "scale_128x128"), assume_installed=True)
    for name in ("torch:scaled_mm_rowwise", "torch:scaled_mm_blockwise"):
        assert "feature" in _reasons(decision, name)
    if sm in ("8.9", "9.0", "10.0", "12.0"):
        assert decision.backend == "triton"
        assert decision.order == ("triton", "reference")
        assert _reasons(decision, "triton") == set()
    else:
        _below_sm89(decision, sm)


@pytest.mark.parametrize("sm", SMS)
def test_groupwise_arbitrary_groups_are_reference_only(sm):
    decision = select(_groupwise(sm, "scale_groupwise"), assume_installed=True)
    assert decision.backend == "reference"
    assert decision.order == ("reference",)
    for name in ("torch:scaled_mm_rowwise", "torch:scaled_mm_blockwise", "triton"):
        assert "feature" in _reasons(decision, name)


def test_strict_refuses_reference_on_gpu():
    """Strict mode refuses the reference for a CUDA problem; since triton serves 128x128 blocks
    on SM 9.0, strict now picks it there and raises only where the reference is all that is
    left (arbitrary groups)."""
    with pytest.raises(StrictModeError):
        select(_groupwise("9.0", "scale_groupwise"), strict=True, assume_installed=True)
    with pytest.raises(StrictModeError):
        select(_groupwise("8.6", "scale_128x128"), strict=True, assume_installed=True)
    strict = select(_groupwise("9.0", "scale_128x128"), strict=True, assume_installed=True)
    assert strict.backend == "triton"
    assert select(_groupwise("cpu", "scale_128x128"), strict=True).backend == "reference"
