"""Grouped / segment GEMM dispatch decisions on simulated SMs (no GPU needed) and on the CPU."""

import pytest

from flashinfer.device import simulated
from flashinfer.dispatch import BackendUnavailableError, Problem, StrictModeError, select
from flashinfer.overrides import collect

SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]
E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"


def _device(sm):
    return simulated(None if sm == "cpu" else sm)


def _segment(sm, dtype="bfloat16", out=None, features=(), layout="column_major", **shape):
    facts = {"num_groups": 8, "m": 1024, "n": 4096, "k": 7168, **shape}
    return Problem.make("segment_gemm", _device(sm),
                        dtypes={"x": dtype, "weights": dtype, "out": out or dtype},
                        shape=facts, features=features, layout=layout)


def _group_fp8(sm, feature="scale_1x128", a=E4M3, **shape):
    facts = {"num_groups": 64, "m": 1024, "n": 2048, "k": 7168, **shape}
    return Problem.make("group_gemm_fp8_groupwise", _device(sm),
                        dtypes={"a": a, "b": a, "out": "bfloat16"}, shape=facts,
                        features=[feature])


def _reasons(decision, name):
    return {r.field for c in decision.candidates if c.name == name for r in c.reasons}


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("layout", ["row_major", "column_major"])
def test_segment_bf16(sm, layout):
    decision = select(_segment(sm, features=("weight_indices",), layout=layout),
                      assume_installed=True)
    if sm in ("9.0", "10.0", "12.0"):  # CUTLASS grouped GEMM inside torch (measured first)
        assert decision.name == "torch:grouped_mm"
        assert decision.order == ("torch:grouped_mm", "triton", "torch:segment_loop",
                                  "reference")
    elif sm == "cpu":  # the float64 reference first: the loop's bf16 torch.mm is slow on CPUs
        assert decision.name == "reference"
        assert decision.order == ("reference", "torch:segment_loop")
        assert _reasons(decision, "torch:grouped_mm") == {"device"}
    elif sm == "7.5":  # below our Triton kernel's SM 8.0: one cuBLAS call per segment
        assert decision.name == "torch:segment_loop"
        assert _reasons(decision, "torch:grouped_mm") == {"sm"}
        assert _reasons(decision, "triton") == {"sm"}
    else:  # 8.0 .. 8.9: our Triton kernel (one launch, no host sync) before the loop
        assert decision.name == "triton"
        assert decision.order == ("triton", "torch:segment_loop", "reference")
        assert _reasons(decision, "torch:grouped_mm") == {"sm"}


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("rows", [1, 16, 32, 128])
def test_segment_few_rows_per_group_prefer_triton_on_hopper(sm, rows):
    """Measured on the H200 (threshold few_rows_per_group_prefers_triton): at <= 16 rows per
    group our kernel beats torch's grouped GEMM; at more rows, and on other SMs, nothing moves."""
    decision = select(_segment(sm, num_groups=64, m=64 * rows, rows_per_group=rows),
                      assume_installed=True)
    default = select(_segment(sm, num_groups=64, m=64 * rows), assume_installed=True)
    if sm == "9.0" and rows <= 16:
        assert decision.name == "triton"
        assert decision.rule == "few_rows_per_group_prefers_triton"
    else:
        assert decision.name == default.name


@pytest.mark.parametrize("sm", ["9.0", "10.0"])
@pytest.mark.parametrize("dtype,out", [("float16", None), (E4M3, "bfloat16"),
                                       ("bfloat16", "float32")])
def test_segment_grouped_mm_is_bf16_only(sm, dtype, out):
    decision = select(_segment(sm, dtype, out), assume_installed=True)
    # fp16 / fp32 out: triton serves it; fp8 inputs: nothing native, the loop
    assert decision.name == ("torch:segment_loop" if dtype == E4M3 else "triton")
    assert _reasons(decision, "torch:grouped_mm") & {"dtype.x", "dtype.out"}


@pytest.mark.parametrize("fact", ["k", "n"])
def test_segment_grouped_mm_needs_16_byte_strides(fact):
    decision = select(_segment("9.0", **{fact: 4100}), assume_installed=True)
    assert decision.name == "triton"  # masked loads: any K / N
    assert _reasons(decision, "torch:grouped_mm") == {fact}


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("feature", ["scale_rowwise", "scale_1x128", "scale_128x128",
                                     "scale_groupwise"])
def test_group_gemm_fp8(sm, feature):
    decision = select(_group_fp8(sm, feature), assume_installed=True)
    # triton first where it serves: SM 8.9+, the Triton fp8 GEMM's scale granularities
    triton = sm not in ("7.5", "8.0", "8.6", "cpu") and feature != "scale_groupwise"
    if triton:
        assert decision.order == ("triton", "torch:dequant_loop", "reference")
    else:
        assert decision.name == "torch:dequant_loop"
        assert decision.order == ("torch:dequant_loop", "reference")
    if sm in ("9.0", "cpu"):  # every usable kernel has run against the reference there
        assert all(c.verified for c in decision.candidates if c.usable)
        assert "[not verified on hardware]" not in decision.explain().split("order:")[0]


def test_group_gemm_fp8_e5m2():
    assert select(_group_fp8("9.0", a=E5M2), assume_installed=True).name == "triton"
    assert select(_group_fp8("8.6", a=E5M2), assume_installed=True).name == "torch:dequant_loop"


def test_strict_mode_accepts_the_loops():
    # the loops are torch kernels, not the reference: strict mode lets them run
    assert select(_segment("7.5", "float16"), strict=True,
                  assume_installed=True).name == "torch:segment_loop"
    assert select(_group_fp8("8.6"), strict=True,
                  assume_installed=True).name == "torch:dequant_loop"


def test_strict_mode_refuses_the_reference():
    with pytest.raises(StrictModeError):
        select(_segment("9.0"), collect("gemm", "reference"), strict=True,
               assume_installed=True)


def test_explicit_grouped_mm_on_ampere_names_the_sm():
    with pytest.raises(BackendUnavailableError, match="requires SM 9.0"):
        select(_segment("8.0"), collect("gemm", "torch:grouped_mm"), assume_installed=True)
