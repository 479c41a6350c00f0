#!/usr/bin/env bash
# Sampling on a GPU machine after a kernel or launch change: the Triton sampling GPU tests, the
# --quick benchmark (ours), the fresh-process first call; then the GEMM target points.
source benchmarks/device_env.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider --maxfail=20 tests/test_triton_sampling.py \
  tests/test_sampling_gpu.py > "$OUT/gpu_tests_sampling.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_sampling.log" | cut -c1-200 | tail -12
cd benchmarks
echo "== sampling --quick"; timeout 170 python3 sampling.py --quick --budget-s 140 --out "$OUT/sampling_quick.json" 2>&1 | tail -14
echo "== first call"; timeout 60 python3 sampling.py --first-call --out "$OUT/sampling_first_call.json" 2>&1 | tail -3
echo "== gemm --quick"; timeout 100 python3 gemm.py --quick --out "$OUT/gemm_quick.json" 2>&1 | tail -14
