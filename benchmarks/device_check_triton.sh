source benchmarks/device_env.sh
echo "== tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider --maxfail=80 \
  tests/test_triton_gemm.py tests/test_triton_moe.py tests/test_triton_sampling.py tests/test_sampling_gpu.py tests/test_norm.py \
  > "$OUT/gpu_tests_triton.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_triton.log" | cut -c1-200 | tail -30
cd benchmarks
echo "== gemm groupwise grid"; timeout 200 python3 gemm.py --only gemm_fp8_nt_groupwise --out "$OUT/gemm_groupwise.json" 2>&1 | tail -52
echo "== sampling first call"; timeout 100 python3 sampling.py --first-call --out "$OUT/sampling_first_call.json" 2>&1 | tail -8
