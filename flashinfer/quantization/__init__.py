"""Quantisation (upstream module ``flashinfer.quantization``): the FP8 / INT8 quantisers
(:mod:`flashinfer.quantization.fp8`), the FP4 ones (:mod:`flashinfer.quantization.fp4`,
whose formats are :mod:`flashinfer.fp4_format`) and bit packing
(:mod:`flashinfer.quantization.packbits`)."""

from .fp4 import (  # noqa: F401
    SfLayout, block_scale_interleave, e2m1_and_ufp8sf_scale_to_float, fp4_quantize,
    mxfp4_dequantize, mxfp4_dequantize_host, mxfp4_quantize, nvfp4_block_scale_interleave,
    nvfp4_quantize,
)
from .packbits import packbits, segment_packbits  # noqa: F401
from .fp8 import (  # noqa: F401
    per_token_group_quant_8bit, quantize_fp8_blockwise, quantize_fp8_per_tensor,
    quantize_fp8_per_token,
)

__all__ = ["per_token_group_quant_8bit", "quantize_fp8_per_tensor", "quantize_fp8_per_token",
           "quantize_fp8_blockwise", "SfLayout", "block_scale_interleave",
           "e2m1_and_ufp8sf_scale_to_float", "fp4_quantize", "mxfp4_dequantize",
           "mxfp4_dequantize_host", "mxfp4_quantize", "nvfp4_block_scale_interleave",
           "nvfp4_quantize", "packbits", "segment_packbits"]
