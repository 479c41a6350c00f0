"""Upstream's legacy module path ``flashinfer.fp4_quantization``: the FP4 quantisers of
:mod:`flashinfer.quantization.fp4` (re-exported, nothing defined here)."""

from .quantization.fp4 import (  # noqa: F401
    SfLayout, block_scale_interleave, e2m1_and_ufp8sf_scale_to_float, fp4_quantize,
    mxfp4_dequantize, mxfp4_dequantize_host, mxfp4_quantize, nvfp4_block_scale_interleave,
    nvfp4_quantize,
)

__all__ = ["SfLayout", "block_scale_interleave", "e2m1_and_ufp8sf_scale_to_float",
           "fp4_quantize", "mxfp4_dequantize", "mxfp4_dequantize_host", "mxfp4_quantize",
           "nvfp4_block_scale_interleave", "nvfp4_quantize"]
