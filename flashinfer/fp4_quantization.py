"""Upstream's legacy module path ``flashinfer.fp4_quantization``: the FP4 quantisers, the same
objects as :mod:`flashinfer.fp4` (re-exported, nothing defined here)."""

from .fp4 import (SfLayout, block_scale_interleave, e2m1_and_ufp8sf_scale_to_float,  # noqa: F401
                  fp4_quantize, mxfp4_dequantize, mxfp4_dequantize_host, mxfp4_quantize,
                  nvfp4_block_scale_interleave, nvfp4_quantize)

__all__ = ["SfLayout", "block_scale_interleave", "e2m1_and_ufp8sf_scale_to_float",
           "fp4_quantize", "mxfp4_dequantize", "mxfp4_dequantize_host", "mxfp4_quantize",
           "nvfp4_block_scale_interleave", "nvfp4_quantize"]
