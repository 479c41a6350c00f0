#!/usr/bin/env bash
# The Triton MoE after the grouped tile order, per-GEMM launch shapes and the finalize kernel
# (no zero-filled float32 buffer): GPU tests of the MoE, then per-kernel times of launch
# configurations on the DeepSeek-V3 layer with plain routing (every expert used), then the
# CUTLASS fresh-process test that failed in the 19:16 full pass, alone and verbose (carry .whl,
# .whl_cutlass).
#   bash benchmarks/device_check_moe_tune.sh
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
GPU_TESTS_TIMEOUT=150 gpu_tests -m gpu tests/test_triton_moe.py tests/test_moe_gpu.py
C1024="32,128,128,128,4,4,4,4,8;32,128,128,128,4,4,4,4,4;32,128,128,128,4,4,4,4,16;32,128,128,128,4,4,4,4,4096"
C1024="$C1024;32,128,128,128,8,3,8,3,8;32,128,256,128,4,4,8,3,8;32,128,128,128,4,5,4,5,8;32,128,128,128,4,3,4,3,8"
C1024="$C1024;16,128,128,128,4,4,4,4,8;64,128,128,128,8,3,8,3,8;64,128,128,128,4,4,4,4,8"
C4096="64,128,128,128,8,3,8,3,8;64,128,128,128,8,3,8,3,4;64,128,128,128,8,3,8,3,16;64,128,128,128,8,3,8,3,4096"
C4096="$C4096;64,128,256,128,8,3,8,3,8;64,128,128,128,4,3,4,3,8;64,128,128,128,8,4,8,4,8;128,128,128,128,8,3,8,3,8"
C4096="$C4096;32,128,128,128,4,4,4,4,8;128,128,256,128,8,3,8,3,8"
echo "== profile 1024"; (cd benchmarks && timeout 150 python3 profile_moe.py --tokens 1024 --plain-routing --bf16-only --configs "$C1024" 2>&1 | grep "^T=" | tee $OUT/profile_moe_1024.txt | cut -c1-170)
echo "== profile 4096"; (cd benchmarks && timeout 150 python3 profile_moe.py --tokens 4096 --plain-routing --bf16-only --configs "$C4096" 2>&1 | grep "^T=" | tee $OUT/profile_moe_4096.txt | cut -c1-170)
echo "== cutlass fresh process"; timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cutlass_adapter.py -k fresh_process -x 2>&1 | tail -30 | cut -c1-400
