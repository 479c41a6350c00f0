#!/usr/bin/env bash
# Batch attention on a GPU machine, one call: plan() piece by piece, the attention grid (every
# backend and auto), then the batch attention GPU tests. Writes to $OUT.
source benchmarks/device_env.sh
echo "== plan breakdown"; timeout 120 python3 benchmarks/plan_breakdown.py > "$OUT/plan_breakdown.txt" 2>&1
head -8 "$OUT/plan_breakdown.txt"
echo "== attention grid"
timeout ${ATTENTION_TIMEOUT:-420} python3 benchmarks/attention.py --iters 8 --out "$OUT/attention.json" \
  > "$OUT/attention.txt" 2>&1; echo "attention rc=$?"
cut -c1-200 "$OUT/attention.txt" | grep -E "auto|error" | tail -30
echo "== gpu tests"
timeout ${GPU_TEST_TIMEOUT:-200} python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=40 \
  tests/test_batch_attention_gpu.py tests/test_flash_attn.py tests/test_torch_ragged.py \
  tests/test_triton_batch_decode.py tests/test_cudnn_paged.py tests/test_attention_gpu.py \
  tests/test_plan_upload.py > "$OUT/gpu_tests_batch.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests_batch.log" | cut -c1-200 | tail -12
