#!/usr/bin/env bash
# One device call (carry .anchor): re-export the sampling kernel pack (now with the two-pass
# sampler, the default for a scalar top-k <= 512), check it and time the first call; then the
# top-k functions' grid, ours (auto) and upstream 0.7.2 (AOT modules) side by side.
source benchmarks/device_env.sh
bash benchmarks/device_check_kernel_pack.sh
echo "== grid ours"; (cd benchmarks && timeout 170 python3 sampling.py --only top_k_ --backends auto,triton:two_pass \
  --budget-s 150 --out $OUT/sampling_topk_grid_ours.json 2>&1 | grep -v "^\[" | tail -30)
R=$PWD
mkdir -p /tmp/anchor && python3 -m pip install -q --no-index --no-deps --target /tmp/anchor .anchor/*.whl && tar -C /tmp/anchor -xJf .anchor/flashinfer-0.7.2-pruned.tar.xz
for so in .anchor/aot/*.so; do m=$(basename $so .so); mkdir -p /tmp/anchor/flashinfer/data/aot/$m && cp $so /tmp/anchor/flashinfer/data/aot/$m/; done
echo "== grid upstream"; (cd /tmp && PYTHONPATH=/tmp/anchor:/tmp/site timeout 170 python3 $R/benchmarks/sampling.py --impl upstream --only top_k_ \
  --budget-s 150 --first-timeout 20 --out $OUT/sampling_topk_grid_upstream.json 2>&1 | grep -v "^\[" | tail -30)
