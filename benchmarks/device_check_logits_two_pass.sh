#!/usr/bin/env bash
# top_k_top_p_sampling_from_logits as one op, the two-pass sampler reading the logits (no carry):
# its GPU tests and the sampling GPU suite, the kernel pack re-exported and checked, the first
# call, and the from-logits grid with every backend (upstream's: the 12:04 UTC grid file).
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
gpu_tests tests/test_triton_logits_two_pass.py tests/test_triton_softmax_streaming.py \
  tests/test_sampling_gpu.py tests/test_triton_sampling_two_pass.py
export_and_check_pack
first_call_with_pack
cd benchmarks && timeout 150 python3 sampling.py --only top_k_top_p_sampling_from_logits --budget-s 120 \
  --out $OUT/sampling_from_logits_grid.json 2>&1 | grep -v "^\[" | tail -20
