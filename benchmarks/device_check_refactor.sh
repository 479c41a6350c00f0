#!/usr/bin/env bash
# After the two-pass sampler moved onto the _stream_kernels helpers (no carry): the sampling GPU
# tests, a timing of the default top-k / top-p / plain / min-p calls against the grid of
# 2026-11-30 12:18 UTC, and the launch-shape sweep of the variants made default this session.
source benchmarks/device_env.sh
echo "== gpu tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_sampling_gpu.py \
  tests/test_triton_sampling_two_pass.py tests/test_triton_nucleus.py tests/test_triton_top_k_two_pass.py \
  tests/test_triton_softmax_streaming.py tests/test_triton_logits_one_pass.py > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
cd benchmarks
echo "== two-pass sampler after the refactor"
timeout 110 python3 sampling.py --only _from_probs --backends auto --budget-s 80 \
  --out $OUT/sampling_probs_two_pass_refactor.json 2>&1 | grep -v "^\[" | tail -40
echo "== launch shapes"; timeout 150 python3 tune_sampling.py --batches 1,16,256 \
  --cases two_pass_plain,nucleus,renorm_two_pass,mask_two_pass,logits_one_pass \
  --shapes 256x8,512x8,512x16,1024x16 --out $OUT/tune_sampling_new_variants.json 2>&1 | tail -16
