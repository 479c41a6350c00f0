#!/usr/bin/env bash
# top_k_top_p_sampling_from_logits as one op, the two-pass sampler reading the logits (no carry):
# its GPU tests and the sampling GPU suite, the kernel pack re-exported and checked, the first
# call, and the from-logits grid with every backend (upstream's: the 12:04 UTC grid file).
source benchmarks/device_env.sh
echo "== gpu tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_logits_two_pass.py \
  tests/test_triton_softmax_streaming.py tests/test_sampling_gpu.py tests/test_triton_sampling_two_pass.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
mkdir -p $OUT/packs
echo "== export"; timeout 200 python3 -m flashinfer warmup --vocab 32000 50257 \
  --export-pack $OUT/packs/triton-$(python3 -c "import triton;print(triton.__version__)")-sm90.tar.xz | tail -2
echo "== check"; timeout 120 python3 benchmarks/check_kernel_pack.py $OUT/packs > $OUT/check_kernel_pack.txt 2>&1
echo "rc=$?"; tail -2 $OUT/check_kernel_pack.txt
echo "== first call"; FLASHINFER_KERNEL_PACK_DIR=$OUT/packs timeout 120 python3 benchmarks/sampling.py \
  --first-call --out $OUT/first_call.json 2>&1 | grep "first call"
cd benchmarks && timeout 150 python3 sampling.py --only top_k_top_p_sampling_from_logits --budget-s 120 \
  --out $OUT/sampling_from_logits_grid.json 2>&1 | grep -v "^\[" | tail -20
