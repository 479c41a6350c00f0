"""Upstream's module path ``flashinfer.grouped_mm``: the grouped GEMMs live in
:mod:`flashinfer.gemm.grouped`."""

from .gemm.grouped import grouped_mm_bf16, grouped_mm_fp8  # noqa: F401

__all__ = ["grouped_mm_bf16", "grouped_mm_fp8"]
