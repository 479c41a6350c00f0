#!/usr/bin/env bash
# plan() A/B in one device call: the batch-attention GPU tests of the working tree, then
# benchmarks/plan_check_probe.py timing the working tree against an older copy of the package
# in one process (carried as build/old/flashinfer_old: `git archive <rev> flashinfer | tar -x -C
# build/old && mv build/old/flashinfer build/old/flashinfer_old`), then cProfile of both.
# Carry .whl and build/old.
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
if [ -z "${SKIP_TESTS:-}" ]; then
  GPU_TESTS_TIMEOUT=${GPU_TESTS_TIMEOUT:-240} gpu_tests tests/test_plan_upload.py tests/test_cudnn_paged.py \
    tests/test_batch_attention_gpu.py tests/test_triton_batch_decode.py
fi
echo "== A/B"
(cd benchmarks && PYTHONPATH=$PYTHONPATH:$PWD/../build/old timeout 200 python3 plan_check_probe.py --reps 400 \
  --no-bare --against flashinfer_old 2>&1 | grep -v "^\[" | tee $OUT/plan_check_probe_ab.txt)
mkdir -p /tmp/oldpkg && cp -r build/old/flashinfer_old /tmp/oldpkg/flashinfer
for impl in new old; do
  P=/tmp/site:$PWD; [ $impl = old ] && P=/tmp/site:/tmp/oldpkg
  (cd benchmarks && PYTHONPATH=$P timeout 60 python3 profile_plan.py --only decode --sort per_call --reps 1000 --top 30 \
    > $OUT/profile_plan_$impl.txt 2>&1; tail -4 $OUT/profile_plan_$impl.txt)
done
