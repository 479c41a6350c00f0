#!/usr/bin/env bash
# The CUTLASS adapter on the GPU (carry .whl and .whl_cutlass: nvidia-cutlass, networkx, pydot,
# pyparsing, treelib). nvcc is left off PATH on purpose: the adapter finds /usr/local/cuda/bin/nvcc
# itself. `flashinfer warmup --cutlass` (nvcc compiles the four kernels in parallel into the
# disk cache), the GPU tests (a fresh process then loads them), the host time of eager calls,
# and (argument `grid`) the GEMM quick grid of every function the adapter serves, with every backend.
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
echo "== warmup --cutlass"; timeout 400 python3 -m flashinfer warmup --cutlass 2>&1 | tail -7
GPU_TESTS_TIMEOUT=240 gpu_tests tests/test_cutlass_adapter.py tests/test_gemm_gpu.py
echo "== launch cost"; timeout 90 python3 benchmarks/probe_cutlass_launch.py --out $OUT/probe_cutlass_launch.json \
  > $OUT/probe_cutlass_launch.txt 2>&1; tail -6 $OUT/probe_cutlass_launch.txt
if [ "${1:-}" = "grid" ]; then
  echo "== gemm quick grid (mm)"
  (cd benchmarks && timeout 300 python3 gemm.py --quick --only mm --iters 10 --out $OUT/gemm_cutlass_quick.json 2>&1 \
    | grep -v "^\[" | tail -24)
fi
