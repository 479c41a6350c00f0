#!/usr/bin/env bash
# Device call (carry .anchor only: with .whl it exceeds 64 MiB): the sampling GPU tests, the
# two-pass sampler now the default for a scalar top-k <= 512, then sampling side by side with
# upstream 0.7.2 (its modules built ahead of time: benchmarks/build_upstream_sampling.sh).
source benchmarks/device_env.sh
echo "== gpu tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_sampling_two_pass.py \
  tests/test_triton_sampling.py tests/test_sampling_gpu.py > "$OUT/gpu_tests_sampling.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests_sampling.log" | cut -c1-200 | tail -8
bash benchmarks/device_check_upstream_sampling.sh
