#!/usr/bin/env bash
# Chain speculative sampling by one inverse-CDF draw (no carry): its GPU tests with the other
# kernels that share the stream helpers, the kernel pack re-exported and checked (the helpers
# changed), and the chain grid with every backend (upstream's: the 12:05 UTC grid file).
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
GPU_TESTS_TIMEOUT=170 gpu_tests tests/test_triton_chain_one_pass.py tests/test_triton_logits_two_pass.py \
  tests/test_triton_nucleus.py tests/test_triton_logits_one_pass.py tests/test_triton_sampling_two_pass.py \
  tests/test_sampling_gpu.py -k "not large_vocab"
export_and_check_pack
cd benchmarks && timeout 60 python3 sampling.py --only chain --budget-s 45 \
  --out $OUT/sampling_chain_grid.json 2>&1 | grep -v "^\[" | tail -14
