#!/usr/bin/env bash
# Next session's device calls (carry .whl, .whl_fa3 and .whl_cutlass: cuDNN frontend, FA3,
# nvidia-cutlass and its deps; `tune` needs none).
#   bash benchmarks/device_check_next.sh tests   every GPU test (sampling, batch attention, GEMM,
#                                                MoE, CUTLASS) after the CUTLASS warm-up, so the
#                                                CUTLASS tests load their kernels from disk
#   bash benchmarks/device_check_next.sh tune    the top-p bracket kernel's launch-shape sweep
#                                                (106 registers at 16 warps: try 8)
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
export PATH=$PATH:/usr/local/cuda/bin
case "${1:-tests}" in
  tests)
    echo "== warmup --cutlass"; timeout 300 python3 -m flashinfer warmup --cutlass 2>&1 | tail -3
    GPU_TESTS_TIMEOUT=420 gpu_tests -m gpu tests ;;
  tune)
    cd benchmarks && timeout 300 python3 tune_sampling.py --cases renorm_bracket --batches 1,16,256 \
      --out "$OUT/tune_sampling_bracket.json" 2>&1 | grep -v "^\[" | tail -6 ;;
esac
