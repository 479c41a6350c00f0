#!/usr/bin/env bash
# Last checks of a session on a GPU machine: Triton MoE (align kernel), Triton grouped GEMM and
# FP4 GPU tests; the MoE layer; the grouped GEMM points; where a sampling first call goes.
source benchmarks/device_env.sh
timeout 130 python3 -m pytest -q -p no:cacheprovider --maxfail=30 tests/test_triton_moe.py \
  tests/test_triton_gemm_grouped.py tests/test_fp4.py > "$OUT/gpu_tests_final.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_final.log" | cut -c1-200 | tail -16
cd benchmarks
echo "== moe"; timeout 70 python3 moe.py --iters 5 --out "$OUT/moe.json" 2>&1 | grep -v torch | tail -12
echo "== grouped"; timeout 50 python3 gemm.py --quick --only grouped --out "$OUT/gemm_grouped.json" 2>&1 | tail -4
echo "== first call x2"; for i in 1 2; do timeout 40 python3 first_call_profile.py --top 14 > "$OUT/first_call_profile_$i.txt" 2>&1; head -1 "$OUT/first_call_profile_$i.txt"; done
