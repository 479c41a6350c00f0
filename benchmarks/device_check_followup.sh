#!/usr/bin/env bash
# Follow-up checks on a GPU machine after CPU-only changes: the sampling kernels (tests, the top-k
# points, the fresh-process first call), then batch attention (GPU tests and the decode grid for
# eager small-batch run() time). Writes to $OUT.
source benchmarks/device_env.sh
echo "== sampling tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider --maxfail=10 tests/test_triton_sampling.py \
  > "$OUT/gpu_tests_sampling.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests_sampling.log" | cut -c1-200 | tail -6
(cd benchmarks
 echo "== first call"; timeout 60 python3 sampling.py --first-call --out "$OUT/sampling_first_call.json" 2>&1 | tail -2
 echo "== sampling top_k"; timeout 90 python3 sampling.py --quick --only top_k --budget-s 60 \
   --out "$OUT/sampling_quick_topk.json" 2>&1 | grep -E "^ +(1|64|256|512) |mask_logits B=256.*triton" | cut -c1-150)
echo "== batch attention tests"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=20 tests/test_batch_attention_gpu.py \
  tests/test_cudnn_paged.py tests/test_plan_upload.py > "$OUT/gpu_tests_batch.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests_batch.log" | cut -c1-200 | tail -6
echo "== attention grid"
timeout ${ATTENTION_TIMEOUT:-240} python3 benchmarks/attention.py --iters 8 --out "$OUT/attention.json" \
  > "$OUT/attention.txt" 2>&1; echo "attention rc=$?"
grep -E "decode B=(1|16) .* auto" "$OUT/attention.txt" | cut -c1-170
