#!/usr/bin/env bash
# GEMM / MoE / sampling / norm on a GPU machine, one call: the GPU tests of those files, then the
# GEMM target points and the DeepSeek-V3 MoE layer (ours). Logs and JSON go to $OUT.
source benchmarks/device_env.sh
echo "== tests (gemm, grouped, moe, triton gemm/moe, sampling, norm)"
timeout ${GPU_TEST_TIMEOUT:-280} python3 -m pytest -q -p no:cacheprovider --maxfail=60 \
  tests/test_gemm_grouped_gpu.py tests/test_moe_gpu.py tests/test_triton_gemm.py \
  tests/test_triton_moe.py tests/test_sampling_gpu.py tests/test_triton_sampling.py tests/test_norm.py \
  > "$OUT/gpu_tests_gemm_moe.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_gemm_moe.log" | cut -c1-240 | tail -40
cd benchmarks
echo "== gemm --quick"; timeout ${GEMM_TIMEOUT:-150} python3 gemm.py --quick --out "$OUT/gemm_quick.json" 2>&1 | tail -30
echo "== moe (ours)"; timeout ${MOE_TIMEOUT:-140} python3 moe.py --out "$OUT/moe.json" 2>&1 | tail -25
