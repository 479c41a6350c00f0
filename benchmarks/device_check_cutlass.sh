#!/usr/bin/env bash
# The CUTLASS adapter on the GPU (carry .whl and .whl_cutlass: nvidia-cutlass, networkx, pydot,
# pyparsing, treelib): `flashinfer warmup --cutlass` (nvcc compiles the two mm_bf16 kernels into the disk
# cache), its GPU tests (a fresh process then loads them), and the mm_bf16 grid with every backend.
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
export PATH=$PATH:/usr/local/cuda/bin
echo "== warmup --cutlass"; timeout 300 python3 -m flashinfer warmup --cutlass 2>&1 | tail -6
GPU_TESTS_TIMEOUT=200 gpu_tests tests/test_cutlass_adapter.py tests/test_gemm_gpu.py
echo "== mm_bf16 grid"
(cd benchmarks && timeout 200 python3 gemm.py --only mm_bf16 --iters 10 --out $OUT/gemm_mm_bf16_cutlass.json 2>&1 \
  | grep -v "^\[" | tail -12)
