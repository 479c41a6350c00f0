#!/usr/bin/env bash
# Batch attention on a GPU machine, one call: GPU tests of the batch ops and the FA adapter, then
# the cuDNN paged probe. Writes gpu_tests_batch.log and probe_cudnn_paged.txt to $OUT.
source benchmarks/device_env.sh
echo "== gpu tests (batch, flash_attn, triton decode, cudnn paged)"
timeout ${GPU_TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=40 \
  tests/test_batch_attention_gpu.py tests/test_flash_attn.py tests/test_torch_ragged.py \
  tests/test_triton_batch_decode.py tests/test_cudnn_paged.py tests/test_attention_gpu.py > "$OUT/gpu_tests_batch.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_batch.log" | cut -c1-220 | tail -45
echo "== cudnn paged probe"; timeout ${PROBE_TIMEOUT:-200} python3 benchmarks/probe_cudnn_paged.py > "$OUT/probe_cudnn_paged.txt" 2>&1; echo "probe rc=$?"
cut -c1-240 "$OUT/probe_cudnn_paged.txt" | tail -40
