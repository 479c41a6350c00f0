#!/usr/bin/env bash
# Device call (no carry): GPU tests of the two-pass sampler's plain / min-p / top-k modes (the
# chi-square tests run every mode), the kernel pack re-exported and checked with its first-call
# timing, then the probability-sampling functions' grid (ours, auto).
source benchmarks/device_env.sh
echo "== gpu tests"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_triton_sampling_two_pass.py \
  tests/test_triton_sampling.py > "$OUT/gpu_tests_sampling.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests_sampling.log" | cut -c1-200 | tail -8
bash benchmarks/device_check_kernel_pack.sh
echo "== grid"; (cd benchmarks && timeout 110 python3 sampling.py --only sampling_from_probs --backends auto \
  --budget-s 90 --out $OUT/sampling_probs_grid.json 2>&1 | grep -v "^\[" | tail -3)
