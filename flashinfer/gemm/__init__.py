"""GEMMs (upstream module ``flashinfer.gemm``): dense BF16 / FP8 / FP4 matmuls
(:mod:`flashinfer.gemm.dense`) and grouped / segment GEMMs (:mod:`flashinfer.gemm.grouped`);
their shared argument checks are :mod:`flashinfer.gemm.checks`."""

from .dense import (  # noqa: F401
    bmm_fp8, gemm_fp8_nt_blockscaled, gemm_fp8_nt_groupwise, mm_bf16, mm_fp4, mm_fp8,
)
from .grouped import (  # noqa: F401
    SegmentGEMMWrapper, group_gemm_fp8_nt_groupwise, grouped_mm_bf16, grouped_mm_fp8,
)

__all__ = ["mm_bf16", "bmm_fp8", "mm_fp8", "gemm_fp8_nt_groupwise", "gemm_fp8_nt_blockscaled",
           "mm_fp4", "SegmentGEMMWrapper", "group_gemm_fp8_nt_groupwise", "grouped_mm_bf16",
           "grouped_mm_fp8"]
