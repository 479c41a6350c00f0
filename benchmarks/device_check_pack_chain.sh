#!/usr/bin/env bash
# After the race chain kernel was removed (the one-pass chain kernel is the Triton backend's only
# one) and the warm-up gained bf16 logits and chain speculative sampling: the sampling GPU tests,
# the kernel pack re-exported and checked, and the first call in a fresh process with it.
# No carry.
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
GPU_TESTS_TIMEOUT=200 gpu_tests tests/test_triton_chain_one_pass.py tests/test_triton_sampling.py \
  tests/test_sampling_gpu.py tests/test_triton_top_p_bracket.py
export_and_check_pack
first_call_with_pack
