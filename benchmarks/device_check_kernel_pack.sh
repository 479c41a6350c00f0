#!/usr/bin/env bash
# Build the sampling kernel pack on the GPU, check it, and time the first call with and without it
# (carry .whl). Writes the pack to $OUT/packs/ (commit it under flashinfer/kernel_packs/).
source benchmarks/device_env.sh
mkdir -p $OUT/packs
echo "== export"; time timeout 300 python3 -m flashinfer warmup --vocab 32000 50257 \
  --export-pack $OUT/packs/triton-$(python3 -c "import triton;print(triton.__version__)")-sm90.tar.xz
echo "== check"; timeout 120 python3 benchmarks/check_kernel_pack.py $OUT/packs > $OUT/check_kernel_pack.txt 2>&1
echo "rc=$?"; tail -3 $OUT/check_kernel_pack.txt
echo "== first call"; FLASHINFER_KERNEL_PACK_DIR=$OUT/packs timeout 200 python3 benchmarks/sampling.py \
  --first-call --out $OUT/first_call.json 2>&1 | grep "first call"
