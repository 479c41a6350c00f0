#!/usr/bin/env bash
# Re-export the sampling kernel pack once every kernel is final (no carry), check it, time the
# first call with it, then the probability-sampling functions' grid with every backend.
source benchmarks/device_env.sh
mkdir -p $OUT/packs
echo "== export"; time timeout 200 python3 -m flashinfer warmup --vocab 32000 50257 \
  --export-pack $OUT/packs/triton-$(python3 -c "import triton;print(triton.__version__)")-sm90.tar.xz | tail -3
echo "== check"; timeout 120 python3 benchmarks/check_kernel_pack.py $OUT/packs > $OUT/check_kernel_pack.txt 2>&1
echo "rc=$?"; tail -3 $OUT/check_kernel_pack.txt
echo "== first call"; FLASHINFER_KERNEL_PACK_DIR=$OUT/packs timeout 120 python3 benchmarks/sampling.py \
  --first-call --out $OUT/first_call.json 2>&1 | grep "first call"
cd benchmarks && timeout 330 python3 sampling.py --only _from_probs --budget-s 300 \
  --out $OUT/sampling_probs_grid_all_backends.json 2>&1 | grep -v "^\[" | tail -3
