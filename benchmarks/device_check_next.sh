#!/usr/bin/env bash
# Next session's device calls (no carry), four of them:
#   bash benchmarks/device_check_next.sh a   GPU tests of the five variants written without a
#                                            GPU on 2026-11-30 (softmax triton:streaming,
#                                            renorm_probs and top_k_mask_logits triton:two_pass,
#                                            sampling_from_logits triton:one_pass,
#                                            sampling_from_probs triton:nucleus for top-p alone),
#                                            and their grids with every backend
#   bash benchmarks/device_check_next.sh b   the probability-sampling functions' grid, every backend
#   bash benchmarks/device_check_next.sh c   the rest of the grid, every backend
#   bash benchmarks/device_check_next.sh d   the new variants' launch-shape sweep
# (b and c: deliverable 5 of issue 4, each function and backend.) Upstream's grid for the same
# points: benchmarks/results/sampling_*_grid_upstream_0.7.2_h200_2026-11-30_120[45]utc.json.
source benchmarks/device_env.sh
case "${1:-a}" in
a)
  echo "== gpu tests"
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_softmax_streaming.py \
    tests/test_triton_top_k_two_pass.py tests/test_triton_logits_one_pass.py tests/test_triton_nucleus.py \
    tests/test_sampling_gpu.py > "$OUT/gpu_tests.log" 2>&1
  echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
  cd benchmarks
  for f in softmax top_k_renorm top_k_mask sampling_from_logits top_p_sampling; do
    echo "== $f"; timeout 75 python3 sampling.py --only $f --budget-s 55 \
      --out $OUT/sampling_${f}_grid.json 2>&1 | grep -v "^\[" | tail -20
  done ;;
b)
  cd benchmarks && timeout 560 python3 sampling.py --only _from_probs --budget-s 520 \
    --out $OUT/sampling_probs_grid_all_backends.json 2>&1 | grep -v "^\[" | tail -5 ;;
d)
  cd benchmarks
  echo "== launch shapes"; timeout 100 python3 tune_sampling.py --batches 1,16,256 \
    --cases two_pass_plain,nucleus,renorm_two_pass,mask_two_pass,logits_one_pass \
    --shapes 256x8,512x8,512x16,1024x16 --out $OUT/tune_sampling_new_variants.json 2>&1 | tail -12 ;;
c)
  cd benchmarks && timeout 560 python3 sampling.py --skip _from_probs --budget-s 520 \
    --out $OUT/sampling_rest_grid_all_backends.json 2>&1 | grep -v "^\[" | tail -5 ;;
esac
