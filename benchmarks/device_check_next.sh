#!/usr/bin/env bash
# Next session's device calls.
#   bash benchmarks/device_check_next.sh pack    (no carry) re-export the kernel pack, which now
#                                                also takes the fp8 GEMM warm-up calls (batched
#                                                bmm_fp8, 128x128 groupwise), check it (sampling
#                                                and GEMM calls served from it, 0 compiled), first
#                                                call with it; copy $OUT/packs/*.tar.xz into
#                                                flashinfer/kernel_packs/ afterwards
#   bash benchmarks/device_check_next.sh tests   (carry .whl, .whl_fa3, .whl_cutlass) every GPU
#                                                test after the CUTLASS warm-up
#   bash benchmarks/device_check_upstream_moe.sh (carry .whl, .anchor with aot/fused_moe_90.so)
#                                                issue 5's MoE target: upstream's cutlass_fused_moe
#                                                (minimal AOT build) against ours, DeepSeek-V3 layer
#   bash benchmarks/device_check_next.sh tune    (no carry) the top-p bracket kernel's launch
#                                                shapes (106 registers at 16 warps: try 8)
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
case "${1:-tests}" in
  pack)
    export_and_check_pack
    first_call_with_pack ;;
  tests)
    echo "== warmup --cutlass"; timeout 300 python3 -m flashinfer warmup --cutlass 2>&1 | tail -6
    GPU_TESTS_TIMEOUT=420 gpu_tests -m gpu tests ;;
  tune)
    cd benchmarks && timeout 300 python3 tune_sampling.py --cases renorm_bracket --batches 1,16,256 \
      --out "$OUT/tune_sampling_bracket.json" 2>&1 | grep -v "^\[" | tail -6 ;;
esac
