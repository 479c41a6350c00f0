"""GEMM dispatch decisions on simulated SMs (no GPU needed) and on the CPU."""

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
    else:  # torch.mm: cuBLAS on every SM from 8.0, the CPU BLAS on cpu
        assert decision.backend == "torch"
        assert decision.order == ("torch", "reference")


@pytest.mark.parametrize("sm", SMS)
def test_bmm_fp8_per_tensor(sm):
    decision = select(_bmm_fp8(sm), assume_installed=True)
    if sm in ("8.9", "9.0", "10.0", "12.0"):
        assert decision.name == "torch:scaled_mm"
    else:
        assert decision.backend == "reference"
        assert _reasons(decision, "torch:scaled_mm") == ({"device"} if sm == "cpu" else {"sm"})


@pytest.mark.parametrize("k,n,field", [(8200, 8192, "k"), (8192, 8200, "n")])
def test_bmm_fp8_misaligned_falls_back(k, n, field):
    decision = select(_bmm_fp8("9.0", k=k, n=n), assume_installed=True)
    assert decision.backend == "reference"
    assert _reasons(decision, "torch:scaled_mm") == {field}


def test_bmm_fp8_e5m2_pairs():
    assert select(_bmm_fp8("9.0", a=E5M2), assume_installed=True).name == "torch:scaled_mm"
    decision = select(_bmm_fp8("9.0", a=E5M2, b=E5M2), assume_installed=True)
    assert decision.backend == "reference"
    assert _reasons(decision, "torch:scaled_mm") == {"dtype.b"}


@pytest.mark.parametrize("sm", SMS)
def test_groupwise_rowwise(sm):
    decision = select(_groupwise(sm, "scale_rowwise"), assume_installed=True)
    if sm in ("9.0", "10.0", "12.0"):
        assert decision.name == "torch:scaled_mm_rowwise"
    else:
        assert decision.backend == "reference"
        assert _reasons(decision, "torch:scaled_mm_rowwise") == (
            {"device"} if sm == "cpu" else {"sm"})


def test_groupwise_rowwise_needs_bf16_out():
    decision = select(_groupwise("9.0", "scale_rowwise", out="float16"), assume_installed=True)
    assert decision.backend == "reference"
    assert _reasons(decision, "torch:scaled_mm_rowwise") == {"dtype.out"}


@pytest.mark.parametrize("sm", SMS)
def test_groupwise_1x128(sm):
    decision = select(_groupwise(sm, "scale_1x128"), assume_installed=True)
    if sm == "9.0":  # cuBLASLt's block-wise recipe exists on SM 9.0 only
        assert decision.name == "torch:scaled_mm_blockwise"
    else:
        assert decision.backend == "reference"
        assert _reasons(decision, "torch:scaled_mm_blockwise") == (
            {"device"} if sm == "cpu" else {"sm"})
    assert "feature" in _reasons(decision, "torch:scaled_mm_rowwise")


@pytest.mark.parametrize("k,n,field", [(7168 + 64, 2048, "k"), (7168, 2048 + 16, "n")])
def test_groupwise_1x128_misaligned_falls_back(k, n, field):
    decision = select(_groupwise("9.0", "scale_1x128", k=k, n=n), assume_installed=True)
    assert decision.backend == "reference"
    assert _reasons(decision, "torch:scaled_mm_blockwise") == {field}


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("feature", ["scale_128x128", "scale_groupwise"])
def test_groupwise_other_blocks_are_reference_only(sm, feature):
    decision = select(_groupwise(sm, feature), assume_installed=True)
    assert decision.backend == "reference"
    for name in ("torch:scaled_mm_rowwise", "torch:scaled_mm_blockwise"):
        assert "feature" in _reasons(decision, name)


def test_strict_refuses_reference_on_gpu():
    with pytest.raises(StrictModeError):
        select(_groupwise("9.0", "scale_128x128"), strict=True, assume_installed=True)
    assert select(_groupwise("cpu", "scale_128x128"), strict=True).backend == "reference"
