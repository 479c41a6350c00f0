#!/usr/bin/env bash
# Next session's device calls (each mode is one call).
#   bash benchmarks/device_check_next.sh tests_a   (carry .whl, .whl_fa3, .whl_cutlass) CUTLASS
#                                                  warm-up, then the GPU tests of tests/test_[a-c]*
#                                                  (not run on 2026-11-30 after 19:16)
#   bash benchmarks/device_check_next.sh tests_b   (carry .whl, .whl_fa3) the GPU tests of
#                                                  tests/test_[d-z]* (646 passed at 20:37)
#   bash benchmarks/device_check_next.sh bmm       (carry .whl) the quick bmm_fp8 grid at MLA
#                                                  shapes, every backend and `auto` (gemm.py)
#   bash benchmarks/device_check_next.sh bmm_short (carry .whl) the same grid without torch's
#                                                  per-batch loop graphs (auto, triton, cudnn
#                                                  only): does a long graph before a short one
#                                                  still bias the short one? (W_UV: gemm.py read
#                                                  Triton 0.96-0.97x cuDNN at 20:44, the
#                                                  tile-shape run 1.02-1.05x at 20:43)
#   bash benchmarks/device_check_next.sh tune_bmm  (carry .whl) launch shapes of the Triton batched
#                                                  fp8 GEMM at MLA shapes, M 1 / 16, against cuDNN
#   bash benchmarks/device_check_next.sh moe_tune  (no carry) launch shapes of the Triton MoE at
#                                                  16 / 256 / 1,024 / 4,096 tokens, per kernel
#   bash benchmarks/device_check_next.sh pack      (no carry) re-export the kernel pack and check it
#   bash benchmarks/device_check_next.sh tune      (no carry) the top-p bracket kernel's launch
#                                                  shapes (106 registers at 16 warps: try 8)
#   bash benchmarks/device_check_next.sh fa2       (carry .whl, .whl_fa2src, .whl_fa2pack) FlashAttention-2
#                                                  linked from kernel objects compiled without a GPU
#                                                  (benchmarks/build_fa2.py), then the fa2 GPU tests
#                                                  and pages of 256: FA2's block table against cuDNN
#   bash benchmarks/device_check_next.sh plan      (carry .whl, .anchor, build/old) issue 3's plan()
#                                                  with checked device page ids: its GPU tests,
#                                                  plan() piece by piece (plan_timeline.py), the working
#                                                  tree against HEAD's copy in one process
#                                                  (build/old/flashinfer_old, plan_check_probe.py),
#                                                  then plan_compare.py ours / upstream / ours
#   bash benchmarks/device_check_next.sh moe       (carry .whl, .anchor) issue 5's MoE comparison
#                                                  again, ours and upstream 0.7.2
#   bash benchmarks/device_check_next.sh final     (carry .whl, .anchor) the batch-attention plan GPU
#                                                  tests, plan_compare.py (repeated and growing
#                                                  batches, ours / upstream / ours), then `moe`
#   bash benchmarks/device_check_next.sh fa2_build (carry .whl_fa2src) the same, every kernel
#                                                  compiled there (about 8 minutes on 16 cores; a
#                                                  second call within 30 s resumes it)
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
fa2_tests() {
  export PYTHONPATH="$PWD/.whl_fa2src/src:$PWD/build/fa2:$PYTHONPATH"
  python3 -c "import flash_attn, flash_attn_2_cuda; print('flash_attn', flash_attn.__version__)" || return
  GPU_TESTS_TIMEOUT=240 gpu_tests -m gpu tests/test_flash_attn.py -k fa2
}
case "${1:?mode: tests_a, tests_b, plan, moe, final, bmm, bmm_short, tune_bmm, moe_tune, pack, tune, fa2 or fa2_build}" in
  plan)
    GPU_TESTS_TIMEOUT=200 gpu_tests -m gpu tests/test_plan_upload.py tests/test_batch_attention_gpu.py \
      tests/test_cudnn_paged.py tests/test_triton_batch_decode.py
    echo "== timeline"; timeout 100 python3 benchmarks/plan_timeline.py --reps 600 2>&1 | grep -v "^\[" \
      | tee $OUT/plan_timeline.txt | grep "=="
    echo "== A/B"; (cd benchmarks && PYTHONPATH=$PYTHONPATH:$PWD/../build/old timeout 150 python3 \
      plan_check_probe.py --reps 400 --no-bare --against flashinfer_old 2>&1 | grep -v "^\[" \
      | tee $OUT/plan_check_probe_ab.txt)
    bash benchmarks/device_check_plan_compare.sh ;;
  moe)
    bash benchmarks/device_check_upstream_moe.sh ;;
  final)
    GPU_TESTS_TIMEOUT=200 gpu_tests -m gpu tests/test_plan_upload.py tests/test_batch_attention_gpu.py \
      tests/test_cudnn_paged.py
    GROWING=1 bash benchmarks/device_check_plan_compare.sh 2>&1 | grep -v "WARNING: Target"
    bash benchmarks/device_check_upstream_moe.sh ;;
  fa2)
    mkdir -p build/fa2_objects && tar -xJf .whl_fa2pack/fa2_objects.tar.xz -C build/fa2_objects
    timeout 300 python3 benchmarks/build_fa2.py --src .whl_fa2src/src --build build/fa2 \
      --objects build/fa2_objects 2>&1 | tail -5
    fa2_tests
    (cd benchmarks && timeout 240 python3 probe_fa2_block_table.py --out $OUT/fa2_block_table.json \
      2>&1 | grep -v "^\[") ;;
  fa2_build)
    timeout 560 python3 benchmarks/build_fa2.py --src .whl_fa2src/src --build build/fa2 --jobs 16 \
      2>&1 | tail -5 && fa2_tests ;;
  bmm_short)
    (cd benchmarks && timeout 200 python3 gemm.py --quick --only bmm_fp8 --iters 40 \
      --backends auto,triton,cudnn --out $OUT/gemm_bmm_fp8_short.json 2>&1 | grep -v "^\[" | tail -10) ;;
  bmm)
    (cd benchmarks && timeout 200 python3 gemm.py --quick --only bmm_fp8 --iters 40 \
      --out $OUT/gemm_bmm_fp8.json 2>&1 | grep -v "^\[" | tail -10) ;;
  pack)
    export_and_check_pack
    first_call_with_pack ;;
  tests_a)
    echo "== warmup --cutlass"; timeout 150 python3 -m flashinfer warmup --cutlass 2>&1 | tail -6
    GPU_TESTS_TIMEOUT=420 gpu_tests -m gpu $(ls tests/test_[a-c]*.py) ;;
  tests_b)
    GPU_TESTS_TIMEOUT=550 gpu_tests -m gpu $(ls tests/test_[d-z]*.py) ;;
  moe_tune)
    # LaunchConfig fields; a tenth field 1 loads the weight tiles through tensor descriptors
    S="16,128,128,128,4,4,4,4,8;16,128,128,128,4,4,4,4,8,1;16,128,128,128,4,6,4,6,8"
    S="$S;16,128,128,128,8,4,8,4,8;16,128,64,128,4,4,4,4,8;16,128,128,128,4,3,4,3,8,1"
    L="64,128,128,128,8,3,4,4,8;64,128,128,128,8,3,4,4,8,1;64,128,128,128,4,3,4,4,8,1"
    for t in 16 256; do
      (cd benchmarks && timeout 120 python3 profile_moe.py --tokens $t --plain-routing --bf16-only \
        --configs "$S" 2>&1 | grep "^T=" | tee -a $OUT/profile_moe_tune.txt | cut -c1-150)
    done
    for t in 1024 4096; do
      (cd benchmarks && timeout 100 python3 profile_moe.py --tokens $t --plain-routing --bf16-only \
        --configs "$L" 2>&1 | grep "^T=" | tee -a $OUT/profile_moe_tune.txt | cut -c1-150)
    done ;;
  tune_bmm)
    cd benchmarks && timeout 300 python3 tune_bmm_fp8.py --out "$OUT/tune_bmm_fp8.json" 2>&1 | tail -8 ;;
  tune)
    cd benchmarks && timeout 300 python3 tune_sampling.py --cases renorm_bracket --batches 1,16,256 \
      --out "$OUT/tune_sampling_bracket.json" 2>&1 | grep -v "^\[" | tail -6 ;;
esac
