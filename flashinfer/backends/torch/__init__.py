"""torch backend: PyTorch's own kernels (FlashAttention-2 and memory-efficient SDPA, cuBLAS /
cuBLASLt GEMMs, the CUTLASS grouped GEMM, sort-based sampling), one module per op family."""
