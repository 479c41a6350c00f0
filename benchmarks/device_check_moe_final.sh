#!/usr/bin/env bash
# The Triton MoE with the new launch table (BLOCK_M 64 with gemm2 on 4 warps beyond 16 pairs
# per expert, group_m 8, finalize kernel): its GPU tests, a few gemm2 shapes around the chosen
# one, then issue 5's MoE figure again, upstream 0.7.2's cutlass_fused_moe (minimal AOT build)
# and ours in one machine start (carry .whl, .anchor).
#   bash benchmarks/device_check_moe_final.sh
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
GPU_TESTS_TIMEOUT=150 gpu_tests -m gpu tests/test_triton_moe.py tests/test_moe_gpu.py
C="64,128,128,128,8,3,4,4,8;64,128,128,128,8,3,4,3,8;64,128,256,128,8,3,4,3,8;64,128,256,128,8,3,8,4,8"
for t in 1024 4096; do
  (cd benchmarks && timeout 100 python3 profile_moe.py --tokens $t --plain-routing --bf16-only --configs "$C" 2>&1 | grep "^T=" | tee -a $OUT/profile_moe_gemm2.txt | cut -c1-150)
done
bash benchmarks/device_check_upstream_moe.sh
