#!/usr/bin/env bash
# The Triton MoE with fewer host steps before gemm1 (the W8A8 input quantised in the
# alignment's launch, one-program alignment up to 128 pairs, one allocation for its outputs):
# its GPU tests, eager / host / kernel / graph times at 1, 16 and 1,024 tokens
# (probe_moe_host.py), then issue 5's MoE figure, upstream 0.7.2 against ours in one machine
# start (carry .whl, .anchor).
#   bash benchmarks/device_check_moe_host.sh
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
GPU_TESTS_TIMEOUT=150 gpu_tests -m gpu tests/test_triton_moe.py tests/test_moe_gpu.py
(cd benchmarks && timeout 120 python3 probe_moe_host.py --tokens 1 16 1024 > $OUT/probe_moe_host.txt 2>&1;
 grep "^T=" $OUT/probe_moe_host.txt | tail -6)
bash benchmarks/device_check_upstream_moe.sh
