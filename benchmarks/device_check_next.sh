#!/usr/bin/env bash
# Next session's device calls (no carry), two of them:
#   bash benchmarks/device_check_next.sh a   GPU tests of the streaming softmax (triton:streaming,
#                                            written without a GPU on 2026-11-30), the softmax grid
#                                            with every backend, the probs functions' grid
#   bash benchmarks/device_check_next.sh b   the rest of the grid with every backend (deliverable
#                                            5 of issue 4: each function and backend)
# Upstream's grid for the same points: sampling_*_grid_upstream_0.7.2_h200_2026-11-30_120[45]utc.json.
source benchmarks/device_env.sh
if [ "${1:-a}" = a ]; then
  echo "== gpu tests"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_softmax_streaming.py \
    tests/test_sampling_gpu.py > "$OUT/gpu_tests_softmax.log" 2>&1
  echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests_softmax.log" | cut -c1-200 | tail -8
  cd benchmarks
  echo "== softmax"; timeout 120 python3 sampling.py --only softmax --budget-s 100 \
    --out $OUT/sampling_softmax_grid.json 2>&1 | grep -v "^\[" | tail -20
  echo "== probs"; timeout 280 python3 sampling.py --only _from_probs --budget-s 250 \
    --out $OUT/sampling_probs_grid_all_backends.json 2>&1 | grep -v "^\[" | tail -5
else
  cd benchmarks
  echo "== rest"; timeout 560 python3 sampling.py --skip _from_probs --budget-s 520 \
    --out $OUT/sampling_rest_grid_all_backends.json 2>&1 | grep -v "^\[" | tail -5
fi
