#!/usr/bin/env bash
# First device call of the next session (carry .anchor only: with .whl it exceeds 64 MiB): the
# GPU tests of the two-pass top-k sampler written without a GPU on 2026-11-30 (variant
# triton:two_pass), then sampling side by side with upstream 0.7.2 (its modules built ahead of
# time: benchmarks/build_upstream_sampling.sh), where `ours` now includes triton:two_pass.
source benchmarks/device_env.sh
echo "== gpu tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_sampling_two_pass.py \
  tests/test_triton_sampling.py > "$OUT/gpu_tests_sampling.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests_sampling.log" | cut -c1-200 | tail -8
bash benchmarks/device_check_upstream_sampling.sh
echo "== launch shapes"
(cd benchmarks && timeout 240 python3 tune_sampling.py --batches 1,256 --shapes 256x8,512x8,512x16,1024x16 \
  --out "$OUT/tune_sampling_two_pass.json" 2>&1 | tail -8)
