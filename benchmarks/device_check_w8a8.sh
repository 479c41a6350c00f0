#!/usr/bin/env bash
# W8A8 Triton MoE and the GEMM rules on a GPU machine: GPU tests, the MoE layer, the launch
# sweeps of the MoE and the samplers. Logs and JSON go to $OUT.
source benchmarks/device_env.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider --maxfail=30 tests/test_triton_moe.py \
  tests/test_triton_gemm.py tests/test_gemm_gpu.py tests/test_moe_gpu.py \
  "tests/test_triton_sampling.py::test_samples_in_keep_set" > "$OUT/gpu_tests_w8a8.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_w8a8.log" | cut -c1-200 | tail -20
cd benchmarks
echo "== moe (ours)"; timeout 100 python3 moe.py --out "$OUT/moe.json" 2>&1 | tail -18
echo "== tune moe"; timeout 120 python3 tune_moe.py --out "$OUT/tune_moe.json" 2>&1 | tail -6
echo "== tune sampling"; timeout 150 python3 tune_sampling.py --batches 256,16 --out "$OUT/tune_sampling.json" 2>&1 | tail -6
