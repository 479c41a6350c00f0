#!/usr/bin/env bash
# First device call of the next session (carry .whl and .anchor): the GPU checks of what landed
# without a GPU on 2026-11-30 (flash_attn paged prefill's host-made gather index), then plan()
# side by side with upstream and the attention grid. Writes to $OUT.
source benchmarks/device_env.sh
echo "== gpu tests"
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=20 tests/test_flash_attn.py \
  tests/test_batch_attention_gpu.py tests/test_cudnn_paged.py tests/test_plan_upload.py \
  tests/test_gemm_grouped_gpu.py > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_row_cleanup.py tests/test_flash_attn.py \
  > "$OUT/native_cpu_marked.log" 2>&1; echo "native rc=$?"; tail -1 "$OUT/native_cpu_marked.log"
bash benchmarks/device_check_plan_compare.sh 2>&1 | grep -E "==|B=64|upstream"
echo "== attention grid"
timeout 240 python3 benchmarks/attention.py --iters 8 --out "$OUT/attention.json" > "$OUT/attention.txt" 2>&1
echo "attention rc=$?"; cut -c1-200 "$OUT/attention.txt" | grep -E "auto|error" | tail -24
