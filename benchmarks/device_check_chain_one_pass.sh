#!/usr/bin/env bash
# Chain speculative sampling by one inverse-CDF draw (no carry): its GPU tests with the other
# kernels that share the stream helpers, the kernel pack re-exported and checked (the helpers
# changed), and the chain grid with every backend (upstream's: the 12:05 UTC grid file).
source benchmarks/device_env.sh
echo "== gpu tests"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_triton_chain_one_pass.py \
  tests/test_triton_logits_two_pass.py tests/test_triton_nucleus.py tests/test_triton_logits_one_pass.py \
  tests/test_triton_sampling_two_pass.py tests/test_sampling_gpu.py -k "not large_vocab" > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
mkdir -p $OUT/packs
echo "== export"; timeout 150 python3 -m flashinfer warmup --vocab 32000 50257 \
  --export-pack $OUT/packs/triton-$(python3 -c "import triton;print(triton.__version__)")-sm90.tar.xz | tail -1
echo "== check"; timeout 90 python3 benchmarks/check_kernel_pack.py $OUT/packs > $OUT/check_kernel_pack.txt 2>&1
echo "rc=$?"; tail -2 $OUT/check_kernel_pack.txt
cd benchmarks && timeout 60 python3 sampling.py --only chain --budget-s 45 \
  --out $OUT/sampling_chain_grid.json 2>&1 | grep -v "^\[" | tail -14
